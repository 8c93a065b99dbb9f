import { status } from '@grpc/grpc-js';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { loadSigningCertificateAuthority } from '../../db/nodes/certificate-authority.ts';
import { createCsr, generateKeyPairPem } from '../../domain/pki.ts';
import { createSealer } from '../../domain/sealing.ts';
import { joinNode } from '../../gateway/join-service.ts';
import { eventually } from '../support/eventually.ts';
import { gatewayTestLog, startTestGateway, useGatewayFixture } from '../support/gateway.ts';
import { testDeploymentSecret } from '../support/secret.ts';

describe('a Join whose reply is lost', () => {
  const fx = useGatewayFixture();

  /** The nodes, certificates and the token's uses, read in one statement (one snapshot). */
  const counts = async (tokenId: string) => {
    const { rows } = await sql<{
      nodes: string[];
      certificates: Array<{ serial: string; node_id: string }>;
      uses: number;
    }>`
      SELECT
        (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM nodes) AS nodes,
        (SELECT coalesce(json_agg(json_build_object('serial', serial, 'node_id', node_id) ORDER BY serial), '[]')
          FROM node_certificates) AS certificates,
        (SELECT uses FROM join_tokens WHERE id = ${tokenId}) AS uses`.execute(fx.database.db);
    return rows[0]!;
  };

  /** What the gateway's JoinService runs with, for calling joinNode directly. */
  const joinOptions = async () => ({
    db: fx.database.db,
    log: gatewayTestLog,
    ca: await loadSigningCertificateAuthority(fx.database.db, {
      trustDomain: 'better-compute.local',
      sealer: createSealer(testDeploymentSecret),
    }),
    trustDomain: 'better-compute.local',
    certificateTtlMs: 3600_000,
  });

  it('bcd join retries through a gateway restart after the commit, and the node joins exactly once', async () => {
    const db = fx.database.db;
    const token = await fx.token(1);
    const tokenId = `jt_${/^bcjt_([0-9a-z]{26})\./.exec(token)![1]}`;
    const port = fx.gateway.port;

    // The token's row held by another transaction: the Join blocks on its last statement (the
    // spend), with the node and certificate written but not committed.
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let held!: () => void;
    const lockHeld = new Promise<void>((resolve) => {
      held = resolve;
    });
    const holder = db.transaction().execute(async (trx) => {
      await sql`SELECT 1 FROM join_tokens WHERE id = ${tokenId} FOR UPDATE`.execute(trx);
      held();
      await released;
    });
    await lockHeld;

    const retries: number[] = [];
    const dir = `${fx.dir}/machine`;
    const joining = joinWithToken({
      gateway: fx.gateway.address,
      token,
      caCertificatePem: fx.gateway.caCertificatePem,
      dir,
      evidence: new SimHardware('lost-reply').evidence(),
      requestedName: 'lost-reply',
      agentVersion: 'test',
      backoff: { minMs: 50, maxMs: 400 },
      onRetry: (error) => retries.push((error as { code: number }).code),
    });
    // The Join waits for the token's row lock.
    await eventually(async () => {
      const { rows } = await sql<{ waiting: number }>`
        SELECT count(*)::int AS waiting FROM pg_stat_activity
        WHERE datname = current_database() AND wait_event_type = 'Lock'`.execute(db);
      return rows[0]!.waiting > 0;
    });

    // The gateway goes away with the Join in flight (its call is cut), then the Join commits.
    await fx.gateway.stop();
    release();
    await holder;
    const committed = await eventually(async () => {
      const now = await counts(tokenId);
      return now.uses === 1 ? now : null;
    });
    expect(committed.nodes).toHaveLength(1);
    // The machine never heard the answer: it is still trying, against a gateway that is down.
    await eventually(async () => retries.length > 0);

    // The gateway is back on its port: the retry (same key, same CSR) is answered with the node
    // and certificate already made, and spends no second use of the one-use token.
    fx.gateway = await startTestGateway({
      db,
      lifecycle: fx.lifecycle,
      port,
      options: { certificateCheckMs: 500 },
    });
    const identity = await joining;
    // The cut call (CANCELLED: the stopping gateway reset its stream), then the refused connections.
    expect(retries.every((code) => code === status.CANCELLED || code === status.UNAVAILABLE)).toBe(true);
    const after = await counts(tokenId);
    expect(after.nodes).toEqual(committed.nodes);
    expect(after.certificates).toEqual(committed.certificates);
    expect(after.uses).toBe(1);
    expect(identity.nodeId).toBe(committed.nodes[0]);
    const stored = await db
      .selectFrom('node_certificates')
      .select('certificate_pem')
      .where('node_id', '=', identity.nodeId)
      .executeTakeFirstOrThrow();
    expect(loadIdentity(dir).certificatePem).toBe(stored.certificate_pem);
    const conditions = await db.selectFrom('node_conditions').select('type').execute();
    expect(conditions.map((c) => c.type)).not.toContain('HardwareKeyConflict');
  });

  it('two Joins with one CSR at once make one node and spend one use', async () => {
    const token = await fx.token(5);
    const tokenId = `jt_${/^bcjt_([0-9a-z]{26})\./.exec(token)![1]}`;
    const options = await joinOptions();
    const request = {
      token,
      csrPem: await createCsr(await generateKeyPairPem(), 'twice'),
      evidence: new SimHardware('twice').evidence(),
      requestedName: 'twice',
      agentVersion: 'test',
      reclaimProof: undefined,
    };
    const before = await counts(tokenId);
    const [first, second] = await Promise.all([joinNode(options, request), joinNode(options, request)]);
    expect(second.nodeId).toBe(first.nodeId);
    expect(second.certificatePem).toBe(first.certificatePem);
    const after = await counts(tokenId);
    expect(after.nodes.length).toBe(before.nodes.length + 1);
    expect(after.certificates.length).toBe(before.certificates.length + 1);
    expect(after.uses).toBe(1);
    // Another key with the same token is a new machine: a second use.
    const other = await joinNode(options, {
      ...request,
      csrPem: await createCsr(await generateKeyPairPem(), 'other'),
      evidence: new SimHardware('other').evidence(),
      requestedName: 'other',
    });
    expect(other.nodeId).not.toBe(first.nodeId);
    expect((await counts(tokenId)).uses).toBe(2);
  });

  it('eight machines joining at once with a token of three uses: three join, five are refused and leave nothing', async () => {
    const db = fx.database.db;
    const token = await fx.token(3);
    const tokenId = `jt_${/^bcjt_([0-9a-z]{26})\./.exec(token)![1]}`;
    const options = await joinOptions();
    const before = await counts(tokenId);
    const requests = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => ({
        token,
        csrPem: await createCsr(await generateKeyPairPem(), `herd-${i}`),
        evidence: new SimHardware(`herd-${i}`).evidence(),
        requestedName: `herd-${i}`,
        agentVersion: 'test',
        reclaimProof: undefined,
      })),
    );
    const outcomes = await Promise.allSettled(requests.map((request) => joinNode(options, request)));
    const joined = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value.nodeId] : []));
    const refused = outcomes.flatMap((o) => (o.status === 'rejected' ? [o.reason] : []));
    expect(joined).toHaveLength(3);
    expect(refused).toHaveLength(5);
    for (const error of refused)
      expect(error).toMatchObject({ code: 'UNAUTHENTICATED', details: { reason: 'used' } });
    const after = await counts(tokenId);
    expect(after.uses).toBe(3);
    // The refused ones' nodes and certificates were rolled back with their commits.
    expect(after.nodes.length).toBe(before.nodes.length + 3);
    expect(after.certificates.length).toBe(before.certificates.length + 3);
    const uses = await db
      .selectFrom('join_token_uses')
      .select('node_id')
      .where('token_id', '=', tokenId)
      .execute();
    expect(uses.map((u) => u.node_id).sort()).toEqual([...joined].sort());
  });
});
