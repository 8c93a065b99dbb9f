import { type RawBuilder, sql } from 'kysely';
import { schedulable } from './placement-load.ts';

/**
 * True when a node is still as a plan from a possibly cached read saw it (NodeVerification):
 * schedulable now; every chosen atom on it, of the class, bookable, healthy and with the attributes
 * seen; and every label the fit needed there (a null value: any). The arguments are SQL values (a
 * parameter or a column): the node's id, the atoms' ids (text[]), the class, the attributes by atom
 * id (jsonb) and the labels needed (jsonb). Meant for the booking's statement, under its locks.
 */
export function nodeAsPlanned(input: {
  nodeId: RawBuilder<unknown>;
  deviceIds: RawBuilder<unknown>;
  deviceClass: RawBuilder<unknown>;
  attributes: RawBuilder<unknown>;
  labels: RawBuilder<unknown>;
}): RawBuilder<boolean> {
  const { nodeId, deviceIds, deviceClass, attributes, labels } = input;
  return sql<boolean>`(
    EXISTS (SELECT 1 FROM nodes n WHERE n.id = ${nodeId} AND ${schedulable})
    AND (SELECT count(*) FROM devices d JOIN nodes n ON n.id = d.node_id
         WHERE d.id = ANY(${deviceIds}) AND d.node_id = ${nodeId} AND d.class = ${deviceClass}
           AND d.bookable AND d.removed_at IS NULL AND d.health = 'healthy'
           AND d.bookable_from_generation <= COALESCE(n.observed_generation, 0)
           AND d.attributes = ${attributes} -> d.id) = cardinality(${deviceIds})
    AND NOT EXISTS (
      SELECT 1 FROM jsonb_each_text(${labels}) AS want(key, value)
      WHERE NOT EXISTS (
        SELECT 1 FROM node_labels l WHERE l.node_id = ${nodeId} AND l.key = want.key
          AND (want.value IS NULL OR l.value = want.value)
          AND (l.key NOT LIKE 'bc.dev/%' OR l.source = 'system'))))`;
}
