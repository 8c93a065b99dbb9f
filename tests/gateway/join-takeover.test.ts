import { cpSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { joinWithToken, loadIdentity, type NodeIdentity, saveIdentity } from '../../daemon/identity.ts';
import { insertPool } from '../../db/nodes/fleet.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import { approveNodeReclaim } from '../../db/nodes/nodes.ts';
import { generateKeyPairPem } from '../../domain/pki.ts';
import type { HardwareEvidence } from '../../proto/gen/agent/v1/agent.ts';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';

/**
 * The join takeover (issue 17): with a join token and another machine's hardware evidence nobody
 * becomes that machine's node; only the previous node key (or an operator) reclaims it, and only
 * within the token's pool.
 */
describe('reclaiming a node at join', () => {
  const fx = useGatewayFixture({}, { nodes: 1, minBackoffMs: 100, until: 'connected' });
  let otherPoolId: string;

  const victim = () => fx.fleet.nodes[0]!;
  const db = () => fx.database.db;
  const tokenFor = async (poolId: string) =>
    (await createJoinToken(db(), { poolId, ttlSeconds: 600, maxUses: 1 })).token;
  const join = (token: string, dir: string, evidence: HardwareEvidence) =>
    joinWithToken({
      gateway: fx.gateway.address,
      token,
      caCertificatePem: fx.gateway.caCertificatePem,
      dir,
      evidence,
      requestedName: 'intruder',
      agentVersion: 'test',
    });
  /** The victim's identity files copied to `dir` (a machine that kept its key on disk). */
  const copyIdentity = (dir: string) => {
    mkdirSync(dir, { recursive: true });
    for (const file of ['key.pem', 'key.pub.pem', 'cert.pem', 'ca.pem', 'node.json'])
      cpSync(path.join(victim().dir, file), path.join(dir, file));
  };
  const certificates = (nodeId: string) =>
    db()
      .selectFrom('node_certificates')
      .select(['serial', 'revoked_at', 'revoke_reason'])
      .where('node_id', '=', nodeId)
      .orderBy('created_at')
      .execute();
  const conditions = (nodeId: string) =>
    db().selectFrom('node_conditions').selectAll().where('node_id', '=', nodeId).execute();
  const nodeRow = (nodeId: string) =>
    db()
      .selectFrom('nodes')
      .select(['id', 'pool_id', 'hardware_key', 'provision_state'])
      .where('id', '=', nodeId)
      .executeTakeFirstOrThrow();

  /** The victim still holds its one certificate and its session (the recheck ran a few times). */
  async function expectVictimUntouched(sessionsBefore: number, hardwareKey: string | null) {
    // Absence of an effect: let the gateway's certificate check (every 500 ms here) run again.
    await new Promise((r) => setTimeout(r, 1_200));
    const certs = await certificates(victim().nodeId);
    expect(certs.filter((c) => c.revoked_at === null)).toHaveLength(certs.length);
    expect(victim().agent.status.connected).toBe(true);
    expect(victim().agent.status.sessions).toBe(sessionsBefore);
    expect((await nodeRow(victim().nodeId)).hardware_key).toBe(hardwareKey);
    expect(await conditions(victim().nodeId)).toEqual([]);
  }

  async function expectConflictNode(joined: { nodeId: string; reclaimed: boolean }, poolId: string) {
    expect(joined.nodeId).not.toBe(victim().nodeId);
    expect(joined.reclaimed).toBe(false);
    const row = await nodeRow(joined.nodeId);
    expect(row).toMatchObject({ pool_id: poolId, hardware_key: null });
    const [condition] = await conditions(joined.nodeId);
    expect(condition).toMatchObject({
      type: 'HardwareKeyConflict',
      reason: 'HardwareKeyInUse',
      effect: 'NoSchedule',
    });
    expect(condition!.message).toContain(victim().nodeId);
  }

  it("another tenant's pool token with the victim's evidence joins as a new node marked HardwareKeyConflict; the victim keeps its certificates and session", async () => {
    otherPoolId = await insertPool(db(), {
      siteId: fx.siteId,
      ownerTenantId: 'tnt_other',
      name: 'intruders',
      gpuModel: 'h100',
    });
    const { hardware_key } = await nodeRow(victim().nodeId);
    expect(hardware_key).not.toBeNull();
    const sessions = victim().agent.status.sessions;
    const joined = await join(
      await tokenFor(otherPoolId),
      `${fx.dir}/intruder-other-pool`,
      victim().hardware.evidence(),
    );
    await expectConflictNode(joined, otherPoolId);
    await expectVictimUntouched(sessions, hardware_key);
  });

  it("the evidence alone, or a proof signed by another key, never reclaims, even with the victim's own pool's token", async () => {
    const { hardware_key } = await nodeRow(victim().nodeId);
    const sessions = victim().agent.status.sessions;
    const plain = await join(
      await tokenFor(fx.poolId),
      `${fx.dir}/intruder-plain`,
      victim().hardware.evidence(),
    );
    await expectConflictNode(plain, fx.poolId);

    // A proof naming the victim, signed by a key that is not the victim's.
    const forgedDir = `${fx.dir}/intruder-forged`;
    const stolen: NodeIdentity = loadIdentity(victim().dir);
    const keys = await generateKeyPairPem();
    saveIdentity(forgedDir, {
      ...stolen,
      privateKeyPem: keys.privateKeyPem,
      publicKeyPem: keys.publicKeyPem,
    });
    const forged = await join(await tokenFor(fx.poolId), forgedDir, victim().hardware.evidence());
    await expectConflictNode(forged, fx.poolId);
    await expectVictimUntouched(sessions, hardware_key);
  });

  it("the previous node key's proof reclaims the node in its own pool, never through another pool's token", async () => {
    const { hardware_key } = await nodeRow(victim().nodeId);
    const sessions = victim().agent.status.sessions;
    // The genuine key, but a token of another pool: the reclaim must stay within the token's pool.
    const elsewhere = `${fx.dir}/genuine-elsewhere`;
    copyIdentity(elsewhere);
    const moved = await join(await tokenFor(otherPoolId), elsewhere, victim().hardware.evidence());
    await expectConflictNode(moved, otherPoolId);
    await expectVictimUntouched(sessions, hardware_key);

    const before = await certificates(victim().nodeId);
    const home = `${fx.dir}/genuine-home`;
    copyIdentity(home);
    const again = await join(await tokenFor(fx.poolId), home, victim().hardware.evidence());
    expect(again).toMatchObject({ nodeId: victim().nodeId, reclaimed: true, poolId: fx.poolId });
    const after = await certificates(victim().nodeId);
    expect(after).toHaveLength(before.length + 1);
    expect(after.filter((c) => c.revoked_at === null).map((c) => c.serial)).toEqual([after.at(-1)!.serial]);
    expect(after.slice(0, -1).every((c) => c.revoke_reason === 'superseded')).toBe(true);
    expect(loadIdentity(home).nodeId).toBe(victim().nodeId);
    // The old identity's live session ends at the next certificate check.
    await eventually(async () => !victim().agent.status.connected);
  });

  it("an operator's approval lets the machine reclaim its node without its key, once and only in its pool", async () => {
    await victim().agent.stop();
    const until = await db()
      .transaction()
      .execute((trx) => approveNodeReclaim(trx, victim().nodeId, 600));
    expect(until.getTime()).toBeGreaterThan(Date.now());
    // Not through another pool's token, approval or not.
    const outside = await join(
      await tokenFor(otherPoolId),
      `${fx.dir}/approved-outside`,
      victim().hardware.evidence(),
    );
    await expectConflictNode(outside, otherPoolId);
    const approved = await join(
      await tokenFor(fx.poolId),
      `${fx.dir}/approved`,
      victim().hardware.evidence(),
    );
    expect(approved).toMatchObject({ nodeId: victim().nodeId, reclaimed: true });
    const certs = await certificates(victim().nodeId);
    expect(certs.filter((c) => c.revoked_at === null)).toHaveLength(1);
    expect(certs.filter((c) => c.revoke_reason === 'reclaimed').length).toBeGreaterThan(0);
    // Used up: the same again is a new node.
    const twice = await join(
      await tokenFor(fx.poolId),
      `${fx.dir}/approved-twice`,
      victim().hardware.evidence(),
    );
    await expectConflictNode(twice, fx.poolId);
  });
});
