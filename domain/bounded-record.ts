import { z } from 'zod';

/**
 * A record (a JSON object used as a map) with at most `maxKeys` keys: INVALID_INPUT names the
 * field when it has more. Bound its keys and values through `key` and `value`. The bound is also
 * stated as `maxProperties` in the JSON Schema (and so in the OpenAPI document).
 */
export function boundedRecord<K extends z.core.$ZodRecordKey, V extends z.ZodType>(
  key: K,
  value: V,
  maxKeys: number,
) {
  return z
    .record(key, value)
    .refine((record) => Object.keys(record).length <= maxKeys, `at most ${maxKeys} keys`)
    .meta({ maxProperties: maxKeys });
}
