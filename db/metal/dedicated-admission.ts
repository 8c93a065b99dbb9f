import type { Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { findImage, imageUsableBy } from './images.ts';
import { findProfile } from './profiles.ts';

type Trx = Transaction<Database>;

/**
 * Admission of a dedicated-root lease (`binding: 'node'`): the pool must set `tenantRoot`, and the
 * profile to deploy must be one of the tenant's with an image the tenant may use. Answers the
 * request with the profile's version pinned (the latest when none was named), so the lease deploys
 * exactly what was admitted. INVALID_INPUT naming the field otherwise. Read-only.
 */
export async function resolveMachineLeaseRequest(
  db: Db | Trx,
  tenantId: string,
  pool: { id: string; policy: { tenantRoot?: boolean | undefined } },
  request: NormalizedRequest,
): Promise<NormalizedRequest> {
  if (!pool.policy.tenantRoot) {
    throw new ComputeError(
      'INVALID_INPUT',
      `binding: 'node' leases whole machines with root on them, which only a pool whose policy sets tenantRoot: true offers; pool ${pool.id} does not (book a hold, or ask an operator for a tenantRoot pool)`,
      { field: 'binding' },
    );
  }
  const wanted = request.node!;
  const profile = await findProfile(db, { profileId: wanted.profileId, version: wanted.profileVersion });
  if (!profile || profile.tenantId !== tenantId) {
    throw new ComputeError(
      'INVALID_INPUT',
      `node.profileId: tenant ${tenantId} has no profile ${wanted.profileId}${wanted.profileVersion ? ` version ${wanted.profileVersion}` : ''}; create one with profiles.create`,
      { field: 'node.profileId' },
    );
  }
  const image = await findImage(db, profile.spec.imageId);
  if (!image || !imageUsableBy(image, tenantId)) {
    throw new ComputeError(
      'INVALID_INPUT',
      `node.profileId: profile ${profile.id} version ${profile.version} deploys image ${profile.spec.imageId}, which tenant ${tenantId} may not use (an unverified image is private to its tenant)`,
      { field: 'node.profileId' },
    );
  }
  return { ...request, node: { profileId: profile.id, profileVersion: profile.version } };
}
