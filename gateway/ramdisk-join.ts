import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { consumeDiscoveryToken } from '../db/metal/discovery-tokens.ts';
import { findSiteBootLease } from '../db/metal/site-leases.ts';
import {
  findReclaimPublicKeys,
  issueStoredNodeCertificate,
  revokeNodeCertificates,
} from '../db/nodes/certificates.ts';
import { ComputeError } from '../domain/errors.ts';
import { computeHardwareKey } from '../domain/hardware-key.ts';
import { ramdiskCertificateMaxMs, verifyDiscoveryAssertion } from '../domain/metal-discovery.ts';
import type { CaMaterial } from '../domain/pki.ts';
import { nodeSpiffeId, readCsr } from '../domain/pki.ts';
import { verifyReclaimProof } from '../domain/reclaim-proof.ts';
import type { JoinRequest, JoinResponse } from '../proto/gen/agent/v1/agent.ts';

/**
 * Join with a discovery token. For role `node` (the system a deploy wrote): the token and a proof
 * by the key of the machine's ramdisk (an unrevoked certificate of the node), like a reclaim; the
 * node's role becomes `node` again. For role `ramdisk`, a network-booted ramdisk with the
 * `discovery` attestor: a single-use discovery token
 * minted for one machine, and the assertion of the site agent that served its boot (carried in
 * the join's `reclaim_proof`: the agent's node id, key id and signature; domain/metal-discovery.ts),
 * checked against the key of the agent that holds the site's boot lease now, at the epoch it
 * signed. The machine's node gets a certificate of role `ramdisk` for at most 2 hours (its earlier
 * certificates revoked: the machine no longer runs what held them) and its role becomes
 * `ramdisk`, which accepts only the commissioning command kinds. Its hardware evidence fills the
 * node's hardware key when no other node holds it. UNAUTHENTICATED for a bad token or assertion.
 */
export async function joinRamdisk(
  options: { db: Db; log: Logger; ca: CaMaterial; trustDomain: string; certificateTtlMs: number },
  request: JoinRequest,
): Promise<JoinResponse> {
  const csr = await readCsr(request.csrPem);
  const refused = (reason: string) =>
    new ComputeError(
      'UNAUTHENTICATED',
      'the ramdisk join is refused: the discovery token or the site agent’s assertion does not check',
      {
        reason,
      },
    );
  return options.db.transaction().execute(async (trx) => {
    const token = await consumeDiscoveryToken(trx, request.token);
    const proof = request.reclaimProof;
    if (!proof?.nodeId || proof.signature.length === 0) throw refused('no second factor');
    if (token.role === 'ramdisk') {
      const lease = await findSiteBootLease(trx, token.siteId);
      if (!lease || lease.expired || lease.holderNodeId !== proof.nodeId) {
        throw refused('the assertion is not by the site’s boot server');
      }
      const keys = await findReclaimPublicKeys(trx, proof.nodeId, proof.keyId);
      const claim = {
        machineNodeId: token.nodeId,
        tokenId: token.tokenId,
        leaseEpoch: lease.epoch,
        csrPem: request.csrPem,
      };
      if (!keys.some((key) => verifyDiscoveryAssertion(claim, proof.signature, key))) {
        throw refused('the assertion does not verify at the current lease epoch');
      }
    } else {
      // The deployed system proves it is the machine whose ramdisk wrote it: that ramdisk's key.
      const keys = await findReclaimPublicKeys(trx, token.nodeId, proof.keyId);
      const proved =
        proof.nodeId === token.nodeId &&
        keys.some((publicKeyPem) =>
          verifyReclaimProof({
            nodeId: token.nodeId,
            csrPem: request.csrPem,
            signature: proof.signature,
            publicKeyPem,
          }),
        );
      if (!proved) throw refused('the proof is not by the key of the machine’s ramdisk');
    }
    const role = token.role;
    const node = await trx
      .selectFrom('nodes')
      .where('id', '=', token.nodeId)
      .select(['id', 'name', 'site_id', 'pool_id', 'provision_state', 'hardware_key'])
      .forUpdate()
      .executeTakeFirst();
    if (!node || node.provision_state === 'retired') throw refused('the machine is retired');
    const evidence = request.evidence;
    const hardware = computeHardwareKey({
      productUuid: evidence?.productUuid,
      serialNumber: evidence?.serialNumber,
      macs: evidence?.macs,
      gpuUuids: evidence?.gpuUuids,
    });
    const keyFree =
      hardware.key !== null &&
      node.hardware_key === null &&
      !(await trx
        .selectFrom('nodes')
        .where('hardware_key', '=', hardware.key)
        .select('id')
        .executeTakeFirst());
    await revokeNodeCertificates(trx, node.id, { reason: 'superseded' });
    await trx
      .updateTable('nodes')
      .set({
        role,
        ...(keyFree ? { hardware_key: hardware.key } : {}),
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', node.id)
      .execute();
    const spiffeId = nodeSpiffeId(options.trustDomain, node.site_id, node.id);
    const cert = await issueStoredNodeCertificate(
      trx,
      {
        ca: options.ca,
        certificateTtlMs:
          role === 'ramdisk'
            ? Math.min(options.certificateTtlMs, ramdiskCertificateMaxMs)
            : options.certificateTtlMs,
      },
      { nodeId: node.id, nodeName: node.name, role, spiffeId, ...csr },
    );
    options.log.info(
      { nodeId: node.id, role, by: proof.nodeId, tokenId: token.tokenId },
      role === 'ramdisk' ? 'ramdisk joined (discovery)' : 'deployed system joined (discovery)',
    );
    return {
      nodeId: node.id,
      nodeName: node.name,
      siteId: node.site_id,
      poolId: node.pool_id ?? '',
      spiffeId,
      certificatePem: cert.certificatePem,
      caCertificatePem: options.ca.certificatePem,
      notAfterMs: cert.notAfter.getTime(),
      reclaimed: true,
    };
  });
}
