import type { IamDb } from '../../core/iam-database.ts';
import { findIdentity } from '../../db/iam/identities.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { Directory } from './directory.ts';

/** Reads the administration methods share: a tenant or an identity that must exist (NOT_FOUND otherwise). */
export function createLookups(db: IamDb, directory: Directory) {
  return {
    async requireTenant(tenantId: string) {
      const tenant = await directory.tenant(tenantId);
      if (!tenant) throw new ComputeError('NOT_FOUND', `tenant ${tenantId} does not exist`);
      return tenant;
    },
    async requireIdentity(identityId: string) {
      const row = await findIdentity(db, identityId);
      if (!row) throw new ComputeError('NOT_FOUND', `identity ${identityId} does not exist`);
      return row;
    },
  };
}
