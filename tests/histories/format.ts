import { temporal } from '@temporalio/proto';

/**
 * Recorded histories as JSON of the History message (64-bit ids as strings, enums by name, bytes
 * in base64), read back into the message the replayer takes. Plain protobufjs object conversion:
 * the SDK's proto-JSON helpers need a protobufjs this install does not share with them.
 */
const History = temporal.api.history.v1.History;

export function historyToRecordedJson(history: temporal.api.history.v1.IHistory): string {
  return JSON.stringify(
    History.toObject(History.fromObject(history), { longs: String, enums: String, bytes: String }),
    null,
    1,
  );
}

export function historyFromRecordedJson(json: string): temporal.api.history.v1.History {
  return History.fromObject(JSON.parse(json));
}
