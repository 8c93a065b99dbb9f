import { describe, expect, it } from 'vitest';
import { type BookedMember, dueRepairMoment, memberTrouble } from './booking-repair.ts';

const healthy: BookedMember = {
  allocationId: 'alloc_1',
  nodeId: 'node_1',
  nodeName: 'gpu-1',
  gangIndex: 0,
  deviceIds: ['dev_1'],
  start: 0,
  end: 1,
  provisionState: 'ready',
  cordoned: false,
  draining: false,
  maintenance: false,
  connectivity: 'connected',
  noSchedule: null,
  unhealthyAtoms: [],
  labels: {},
};

describe('BookingRepair, pure', () => {
  it('names why a member is bad, or null', () => {
    expect(memberTrouble(healthy)).toBeNull();
    expect(memberTrouble({ ...healthy, cordoned: true, draining: true })).toBe('draining');
    expect(memberTrouble({ ...healthy, maintenance: true })).toBe('maintenance');
    expect(memberTrouble({ ...healthy, connectivity: 'unreachable' })).toBe('unreachable');
    expect(memberTrouble({ ...healthy, noSchedule: 'DiskPressure' })).toBe(
      'NoSchedule condition DiskPressure',
    );
    expect(memberTrouble({ ...healthy, unhealthyAtoms: ['GPU-a'] })).toBe('unhealthy atoms GPU-a');
  });

  it('is due 15 minutes before the start and at it, once each, for calendar reservations only', () => {
    const pre = 900_000;
    const at = (now: number) => ({ calendar: true, start: 10_000_000, now });
    expect(dueRepairMoment(at(10_000_000 - pre - 1), pre, [])).toBeNull();
    expect(dueRepairMoment(at(10_000_000 - pre), pre, [])).toBe('pre-start');
    expect(dueRepairMoment(at(10_000_000 - 1), pre, ['pre-start'])).toBeNull();
    expect(dueRepairMoment(at(10_000_000), pre, ['pre-start'])).toBe('start');
    expect(dueRepairMoment(at(10_000_001), pre, ['pre-start', 'start'])).toBeNull();
    expect(dueRepairMoment({ ...at(10_000_000), calendar: false }, pre, [])).toBeNull();
  });
});
