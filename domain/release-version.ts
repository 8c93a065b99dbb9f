import { ComputeError } from './errors.ts';

/**
 * Versions of bcd and of the control plane (`major.minor.patch`, an optional `-tag`), and the
 * session protocol's version window: the gateway accepts the current protocol and the two before it
 * (N-2), and refuses a newer bcd than it speaks with a message that says to upgrade the control
 * plane first.
 */

export const versionPattern = /^\d{1,6}\.\d{1,6}\.\d{1,6}(-[0-9A-Za-z.-]{1,40})?$/;

/** This control plane's version (package.json), which a release's `minControlPlaneVersion` is held to. */
export const controlPlaneVersion = '0.1.0';

/**
 * The session protocol this control plane speaks. 1: the first protocol (a Hello without a version
 * says 1); 2: Hello carries `protocol_version`; 3: bcd reports `UpdateStatus` (self-update).
 */
export const currentProtocolVersion = 3;

/** How many protocol versions before the current one the gateway still accepts (N-2). */
export const protocolSkew = 2;

/** -1, 0 or 1 as `a` is lower than, equal to or higher than `b` (a `-tag` sorts before its release). */
export function compareVersions(a: string, b: string): number {
  const parse = (v: string) => {
    const [core, tag] = v.split(/-(.*)/s, 2) as [string, string | undefined];
    return { parts: core.split('.').map(Number), tag: tag ?? null };
  };
  const x = parse(a);
  const y = parse(b);
  for (let i = 0; i < 3; i++) {
    const d = (x.parts[i] ?? 0) - (y.parts[i] ?? 0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  if (x.tag === y.tag) return 0;
  if (x.tag === null) return 1;
  if (y.tag === null) return -1;
  return x.tag < y.tag ? -1 : 1;
}

/**
 * The protocol version a Hello declares (0, from a bcd that predates the field, is 1), or a
 * ComputeError: UNSUPPORTED for a bcd newer than this control plane (upgrade the control plane
 * first) or older than N-2 (update bcd).
 */
export function acceptProtocolVersion(declared: number, current = currentProtocolVersion): number {
  const version = declared === 0 ? 1 : declared;
  if (version > current) {
    throw new ComputeError(
      'UNSUPPORTED',
      `this bcd speaks session protocol ${version}, newer than this control plane's ${current} (it accepts ${Math.max(1, current - protocolSkew)} to ${current}): upgrade the control plane before rolling out this bcd`,
      { protocolVersion: version, accepted: [Math.max(1, current - protocolSkew), current] },
    );
  }
  if (version < current - protocolSkew) {
    throw new ComputeError(
      'UNSUPPORTED',
      `this bcd speaks session protocol ${version}, older than this control plane accepts (${current - protocolSkew} to ${current}): update bcd to a newer release`,
      { protocolVersion: version, accepted: [current - protocolSkew, current] },
    );
  }
  return version;
}
