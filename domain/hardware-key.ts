import { createHash } from 'node:crypto';

/**
 * The hardware key: SHA-256 of a machine's normalized product UUID, serial number, permanent MACs
 * and GPU UUIDs, used to recognize the same machine across joins. It is trusted only when at least
 * two independent identifiers (product UUID, serial, the MAC set, the GPU UUID set) survive the
 * placeholder blocklist; otherwise a join creates a new node and never reclaims one.
 */

export interface HardwareEvidenceInput {
  productUuid?: string;
  serialNumber?: string;
  macs?: readonly string[];
  gpuUuids?: readonly string[];
}

const placeholderUuids = new Set([
  '00000000-0000-0000-0000-000000000000',
  'ffffffff-ffff-ffff-ffff-ffffffffffff',
  '03000200-0400-0500-0006-000700080009',
  '12345678-1234-5678-90ab-cddeefaabbcc',
]);

const placeholderSerials = new Set([
  '',
  '0',
  '00000000',
  '0123456789',
  '123456789',
  '1234567890',
  'default string',
  'default',
  'none',
  'n/a',
  'na',
  'not specified',
  'not applicable',
  'system serial number',
  'chassis serial number',
  'to be filled by o.e.m.',
  'to be filled by oem',
  'unknown',
  'invalid',
  'empty',
  'serial',
  'xxxxxxxx',
]);

function normalizeUuid(value: string | undefined): string | null {
  const v = (value ?? '').trim().toLowerCase();
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(v)) return null;
  if (placeholderUuids.has(v) || /^(.)\1{7}-\1{4}-\1{4}-\1{4}-\1{12}$/.test(v)) return null;
  return v;
}

function normalizeSerial(value: string | undefined): string | null {
  const v = (value ?? '').trim().toLowerCase().replace(/\s+/g, ' ');
  if (placeholderSerials.has(v) || /^(.)\1*$/.test(v) || v.length < 4) return null;
  return v;
}

/** A permanent, globally administered unicast MAC, or null. */
function normalizeMac(value: string): string | null {
  const hex = value
    .trim()
    .toLowerCase()
    .replace(/[^0-9a-f]/g, '');
  if (hex.length !== 12 || /^(.)\1*$/.test(hex)) return null;
  const first = Number.parseInt(hex.slice(0, 2), 16);
  if (first & 0x01 || first & 0x02) return null; // multicast or locally administered
  return hex.match(/../g)!.join(':');
}

function normalizeGpuUuid(value: string): string | null {
  const v = value.trim().toLowerCase();
  const body = v.startsWith('gpu-') ? v.slice(4) : v;
  const uuid = normalizeUuid(body);
  return uuid ? `gpu-${uuid}` : null;
}

export interface HardwareKeyResult {
  /** Hex SHA-256 of the surviving identifiers, or null when fewer than two kinds survive. */
  key: string | null;
  /** Which kinds of identifier survived the blocklist. */
  identifiers: Array<'productUuid' | 'serialNumber' | 'macs' | 'gpuUuids'>;
}

/** Normalizes the evidence and computes the hardware key; pure and deterministic. */
export function computeHardwareKey(evidence: HardwareEvidenceInput): HardwareKeyResult {
  const productUuid = normalizeUuid(evidence.productUuid);
  const serialNumber = normalizeSerial(evidence.serialNumber);
  const macs = [...new Set((evidence.macs ?? []).map(normalizeMac).filter((m): m is string => !!m))].sort();
  const gpuUuids = [
    ...new Set((evidence.gpuUuids ?? []).map(normalizeGpuUuid).filter((g): g is string => !!g)),
  ].sort();
  const identifiers: HardwareKeyResult['identifiers'] = [];
  if (productUuid) identifiers.push('productUuid');
  if (serialNumber) identifiers.push('serialNumber');
  if (macs.length > 0) identifiers.push('macs');
  if (gpuUuids.length > 0) identifiers.push('gpuUuids');
  if (identifiers.length < 2) return { key: null, identifiers };
  const canonical = JSON.stringify({ productUuid, serialNumber, macs, gpuUuids });
  return { key: createHash('sha256').update(canonical).digest('hex'), identifiers };
}
