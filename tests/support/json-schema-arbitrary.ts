import fc from 'fast-check';

// biome-ignore lint/suspicious/noExplicitAny: a JSON Schema, read by keyword.
export type JsonSchema = { [keyword: string]: any };

export interface SchemaArbitraryOptions {
  /** The schema a `$ref` (such as `#/components/schemas/X`) points at. */
  resolve(ref: string): JsonSchema;
  /** How many `$ref`s deep a value may go before only leaf branches are taken (default 3). */
  maxRefDepth?: number;
  /** The most items or extra keys generated beyond a minimum (default 3). */
  maxExtra?: number;
}

const leafTypes = new Set(['null', 'boolean', 'number', 'integer', 'string']);

/** Whether every value of `schema` is a leaf (no object, no array). */
function isLeaf(schema: JsonSchema, options: SchemaArbitraryOptions): boolean {
  const resolved = schema.$ref ? options.resolve(schema.$ref) : schema;
  if ('const' in resolved || 'enum' in resolved) return true;
  const types = Array.isArray(resolved.type) ? resolved.type : [resolved.type];
  return types.every((t: unknown) => typeof t === 'string' && leafTypes.has(t));
}

function integerBetween(min: number, max: number): fc.Arbitrary<number> {
  if (min >= -(2 ** 31) && max <= 2 ** 31 - 1) return fc.integer({ min, max });
  // Small numbers where the range has them, else just above its minimum; and anywhere in it.
  const near = Math.min(Math.max(min, -1000), max);
  return fc.oneof(
    fc.constantFrom(min, max),
    fc.integer({ min: 0, max: Math.min(2000, max - near) }).map((n) => near + n),
    fc.bigInt({ min: BigInt(min), max: BigInt(max) }).map(Number),
  );
}

function numberArbitrary(schema: JsonSchema, integer: boolean): fc.Arbitrary<number> {
  const lowest = integer ? Number.MIN_SAFE_INTEGER : -Number.MAX_VALUE;
  const highest = integer ? Number.MAX_SAFE_INTEGER : Number.MAX_VALUE;
  let min: number = schema.minimum ?? lowest;
  let max: number = schema.maximum ?? highest;
  if (schema.exclusiveMinimum !== undefined) min = Math.max(min, schema.exclusiveMinimum + (integer ? 1 : 0));
  if (schema.exclusiveMaximum !== undefined) max = Math.min(max, schema.exclusiveMaximum - (integer ? 1 : 0));
  if (integer) return integerBetween(Math.ceil(min), Math.floor(max));
  return fc.oneof(
    fc.double({
      min,
      max,
      noNaN: true,
      noDefaultInfinity: true,
      minExcluded: schema.exclusiveMinimum !== undefined,
      maxExcluded: schema.exclusiveMaximum !== undefined,
    }),
    integerBetween(Math.ceil(Math.max(min, -1e6)), Math.floor(Math.min(max, 1e6))),
  );
}

function stringArbitrary(schema: JsonSchema): fc.Arbitrary<string> {
  const minLength: number = schema.minLength ?? 0;
  const maxLength: number = schema.maxLength ?? Number.POSITIVE_INFINITY;
  const fits = (s: string) => s.length >= minLength && s.length <= maxLength;
  if (typeof schema.pattern === 'string') return fc.stringMatching(new RegExp(schema.pattern)).filter(fits);
  const lengths = { minLength, maxLength: Math.min(maxLength, minLength + 40) };
  return fc
    .oneof(fc.string({ unit: 'grapheme', ...lengths }), fc.string({ unit: 'binary', ...lengths }))
    .filter(fits);
}

/**
 * Values of a JSON Schema (2020-12, as OpenAPI 3.1 documents carry them), from the schema alone:
 * `$ref`, `const`, `enum`, `anyOf`/`oneOf`, `allOf` (its first part; callers filter by a real
 * validator), types, bounds, patterns (fast-check's `stringMatching`), required and optional
 * properties, records (`propertyNames` + `additionalProperties`) and arrays. Not every value
 * satisfies every keyword (`allOf`, `uniqueItems`): filter by a validator of the same schema.
 */
export function arbitraryFromSchema(
  schema: JsonSchema | boolean,
  options: SchemaArbitraryOptions,
  depth = 0,
): fc.Arbitrary<unknown> {
  const maxExtra = options.maxExtra ?? 3;
  const maxRefDepth = options.maxRefDepth ?? 3;
  if (schema === true) return fc.jsonValue({ maxDepth: 2 });
  if (schema === false) throw new Error('arbitraryFromSchema: nothing matches `false`');
  if (schema.$ref) {
    const { $ref, ...siblings } = schema;
    return arbitraryFromSchema({ ...options.resolve($ref), ...siblings }, options, depth + 1);
  }
  if ('const' in schema) return fc.constant(schema.const);
  if (Array.isArray(schema.enum)) return fc.constantFrom(...schema.enum);
  for (const keyword of ['anyOf', 'oneOf'] as const) {
    if (Array.isArray(schema[keyword])) {
      const { [keyword]: branches, ...rest } = schema;
      let chosen = branches as JsonSchema[];
      if (depth >= maxRefDepth) {
        const leaves = chosen.filter((b) => isLeaf(b, options));
        // No leaf (a recursive tree such as a policy condition): the branches that refer onwards
        // least, so that generation ends.
        const refs = (b: JsonSchema) => JSON.stringify(b).split('"$ref"').length;
        const fewest = Math.min(...chosen.map(refs));
        chosen = leaves.length > 0 ? leaves : chosen.filter((b) => refs(b) === fewest);
      }
      return fc.oneof(...chosen.map((b) => arbitraryFromSchema({ ...rest, ...b }, options, depth)));
    }
  }
  if (Array.isArray(schema.allOf)) {
    const { allOf, ...rest } = schema;
    const [first, ...others] = allOf as JsonSchema[];
    const merged = { ...rest, ...(first ?? {}) };
    // A pattern of the schema itself wins over a part's: the part is the wider rule.
    if (rest.pattern && others.length + 1 === allOf.length) merged.pattern = rest.pattern;
    return arbitraryFromSchema(merged, options, depth);
  }
  if (Array.isArray(schema.type)) {
    return fc.oneof(
      ...schema.type.map((type: string) => arbitraryFromSchema({ ...schema, type }, options, depth)),
    );
  }
  switch (schema.type) {
    case 'null':
      return fc.constant(null);
    case 'boolean':
      return fc.boolean();
    case 'integer':
      return numberArbitrary(schema, true);
    case 'number':
      return numberArbitrary(schema, false);
    case 'string':
      return stringArbitrary(schema);
    case 'array': {
      const minLength: number = schema.minItems ?? 0;
      const maxLength = Math.min(schema.maxItems ?? Number.POSITIVE_INFINITY, minLength + maxExtra);
      const items = schema.items ?? true;
      if (depth >= maxRefDepth && minLength === 0) return fc.constant([]);
      return fc.array(arbitraryFromSchema(items, options, depth + 1), { minLength, maxLength });
    }
    case 'object': {
      const properties: Record<string, JsonSchema> = schema.properties ?? {};
      const required = new Set<string>(schema.required ?? []);
      const known = fc.record(
        Object.fromEntries(
          Object.entries(properties).map(([name, s]) => [name, arbitraryFromSchema(s, options, depth + 1)]),
        ),
        { requiredKeys: [...required].filter((name) => name in properties) },
      );
      const extra = schema.additionalProperties;
      if (!extra || typeof extra !== 'object' || depth >= maxRefDepth) return known;
      const maxKeys = Math.min(schema.maxProperties ?? Number.POSITIVE_INFINITY, maxExtra);
      const keys = arbitraryFromSchema(
        { type: 'string', ...(schema.propertyNames ?? {}) },
        options,
        depth + 1,
      );
      return fc
        .tuple(
          known,
          fc.dictionary(keys as fc.Arbitrary<string>, arbitraryFromSchema(extra, options, depth + 1), {
            maxKeys,
          }),
        )
        .map(([fixed, more]) => ({ ...more, ...fixed }));
    }
    default:
      return fc.jsonValue({ maxDepth: 2 });
  }
}
