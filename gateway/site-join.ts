import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { insertSiteAgentNode } from '../db/metal/site-agents.ts';
import { consumeSiteJoinToken } from '../db/metal/site-tokens.ts';
import { issueStoredNodeCertificate } from '../db/nodes/certificates.ts';
import type { CaMaterial } from '../domain/pki.ts';
import { nodeSpiffeId, readCsr } from '../domain/pki.ts';
import type { JoinRequest, JoinResponse } from '../proto/gen/agent/v1/agent.ts';
import { normalizeNodeName } from './node-name.ts';

/**
 * Join with a site token (`bcst_…`): a new site agent node (role `site`, no pool) at the token's
 * site and its certificate of role `site`, the token's use spent, in one transaction. A site agent
 * holds no allocation and never reclaims: a replaced machine joins again with a new token.
 * UNAUTHENTICATED for a bad token.
 */
export async function joinSiteAgent(
  options: { db: Db; log: Logger; ca: CaMaterial; trustDomain: string; certificateTtlMs: number },
  request: JoinRequest,
): Promise<JoinResponse> {
  const csr = await readCsr(request.csrPem);
  return options.db.transaction().execute(async (trx) => {
    const token = await consumeSiteJoinToken(trx, request.token);
    const node = await insertSiteAgentNode(trx, {
      siteId: token.siteId,
      name: normalizeNodeName(request.requestedName, request.evidence?.hostname ?? ''),
    });
    const spiffeId = nodeSpiffeId(options.trustDomain, token.siteId, node.id);
    const cert = await issueStoredNodeCertificate(trx, options, {
      nodeId: node.id,
      nodeName: node.name,
      role: 'site',
      spiffeId,
      ...csr,
    });
    options.log.info({ nodeId: node.id, nodeName: node.name, siteId: token.siteId }, 'site agent joined');
    return {
      nodeId: node.id,
      nodeName: node.name,
      siteId: token.siteId,
      poolId: '',
      spiffeId,
      certificatePem: cert.certificatePem,
      caCertificatePem: options.ca.certificatePem,
      notAfterMs: cert.notAfter.getTime(),
      reclaimed: false,
    };
  });
}
