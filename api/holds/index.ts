import { holdLifecycleMethods } from './holds.ts';
import { holdKindMethods } from './kinds.ts';

/** `holds.*`: workload kinds per pool, and the holds a placed workload keeps on its host. */
export const holdMethods = { ...holdLifecycleMethods, ...holdKindMethods };
