import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** A `kubernetes`-bound hold withdrawn from the NodeSpec while pods still held some of its atoms. */
export interface DrainingHold {
  allocationId: string;
  stableIds: string[];
}

const suffix = '.draining';
const allocationPattern = /^[A-Za-z0-9_-]{1,100}$/;

/**
 * The `kubernetes`-bound holds bcd has stopped advertising but whose atoms pods still hold: bcd
 * reports each released only once no pod holds any of them (the control plane keeps the
 * reservation `releasing` with `DevicesHeld` until then). Kept on disk as `<allocation>.draining`
 * beside the env files, so a restarted bcd still reports them when the pods go.
 */
export class DrainingHolds {
  constructor(private readonly dir: string) {}

  private file(allocationId: string): string {
    if (!allocationPattern.test(allocationId)) throw new Error('refusing an unsafe allocation id');
    return path.join(this.dir, `${allocationId}${suffix}`);
  }

  add(hold: DrainingHold): void {
    mkdirSync(this.dir, { recursive: true });
    const file = this.file(hold.allocationId);
    writeFileSync(`${file}.tmp`, JSON.stringify({ stableIds: hold.stableIds }));
    renameSync(`${file}.tmp`, file);
  }

  remove(allocationId: string): void {
    rmSync(this.file(allocationId), { force: true });
  }

  /** Every draining hold on disk; an unreadable file is skipped (the control plane's carry limit then ends that release). */
  list(): DrainingHold[] {
    let names: string[];
    try {
      names = readdirSync(this.dir).filter((f) => f.endsWith(suffix));
    } catch {
      return [];
    }
    return names.flatMap((name) => {
      const allocationId = name.slice(0, -suffix.length);
      if (!allocationPattern.test(allocationId)) return [];
      try {
        const body = JSON.parse(readFileSync(path.join(this.dir, name), 'utf8')) as { stableIds?: unknown };
        const stableIds = Array.isArray(body.stableIds)
          ? body.stableIds.filter((id): id is string => typeof id === 'string')
          : [];
        return [{ allocationId, stableIds }];
      } catch {
        return [];
      }
    });
  }
}
