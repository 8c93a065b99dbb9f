/** The longest node name (a DNS label). */
export const maxNodeNameLength = 63;

const dash = 0x2d;

function allowed(code: number): boolean {
  return (
    (code >= 0x61 && code <= 0x7a) || // a-z
    (code >= 0x30 && code <= 0x39) || // 0-9
    code === 0x2e || // .
    code === dash
  );
}

/**
 * The node name a join asks for (`requested`, else `hostname`, else `node`), lower-cased, each run
 * of characters outside `[a-z0-9.-]` turned into one `-`, without leading or trailing dashes, at
 * most 63 characters (`node` when nothing is left). One pass over the input and no regular
 * expression: its time grows linearly with the input, whatever the input is (a backtracking
 * pattern such as `-+$` is quadratic on a long run of dashes).
 */
export function normalizeNodeName(requested: string, hostname: string): string {
  const raw = (requested || hostname || 'node').toLowerCase();
  let name = '';
  let replaced = false;
  for (let i = 0; i < raw.length && name.length < maxNodeNameLength; i++) {
    const code = raw.charCodeAt(i);
    if (allowed(code)) {
      replaced = false;
      // Leading dashes are dropped as they come.
      if (code !== dash || name.length > 0) name += raw[i];
    } else if (!replaced) {
      replaced = true;
      if (name.length > 0) name += '-';
    }
  }
  let end = name.length;
  while (end > 0 && name.charCodeAt(end - 1) === dash) end--;
  return end > 0 ? name.slice(0, end) : 'node';
}
