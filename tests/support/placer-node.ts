import type { PlacerDevice, PlacerNode } from '../../domain/placer.ts';

/**
 * A schedulable node as the placer sees it, for the pure placer tests: `gpus` whole GPUs (8 by
 * default) named `<name>-gpu<i>`, each with `attributes(i)` (default `{ index: i }`) and
 * `bookings(i)` (default none); anything else of the node overridden by `node`.
 */
export function placerNode(
  name: string,
  options: {
    gpus?: number;
    attributes?: (i: number) => Record<string, unknown>;
    bookings?: (i: number) => PlacerDevice['bookings'];
    node?: Partial<PlacerNode>;
  } = {},
): PlacerNode {
  return {
    id: `node_${name}`,
    name,
    ready: true,
    cordoned: false,
    maintenance: false,
    draining: false,
    connected: true,
    converged: true,
    noSchedule: null,
    labels: {},
    host: {},
    devices: Array.from({ length: options.gpus ?? 8 }, (_, i) => ({
      id: `${name}-gpu${i}`,
      class: 'gpu',
      attributes: options.attributes?.(i) ?? { index: i },
      healthy: true,
      bookings: options.bookings?.(i) ?? [],
    })),
    ...options.node,
  };
}
