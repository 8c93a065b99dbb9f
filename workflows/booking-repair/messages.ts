/**
 * The BookingRepair workflow's input, importable by the lifecycle and the CLI without pulling in
 * the workflow body. One run per repair: its id is bookingRepairWorkflowId(reservation, moment).
 */
import type { RepairMoment } from '../../domain/booking-repair.ts';

export const bookingRepairWorkflowType = 'bookingRepair';

export interface BookingRepairInput {
  reservationId: string;
  /** 15 minutes before the start (`pre-start`) or at it (`start`). */
  moment: RepairMoment;
  /** How long one activity attempt may run before Temporal retries it elsewhere (60 s). */
  activityTimeoutMs?: number;
}
