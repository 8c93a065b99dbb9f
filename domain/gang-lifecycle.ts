import type { AllocationView, LifecycleAction, ReservationSnapshot } from './reservation-lifecycle-types.ts';

/**
 * The gang rules of the reservation lifecycle, pure: while a gang binds, a member whose node
 * refused the binding, or that is not bound by the bind deadline, is re-placed on its own (same
 * topology value) while the others keep their bookings, at most `maxMemberReplacements` times;
 * past that the whole gang fails its binding attempt as a single-node reservation would.
 */

/** How often one gang member may be re-placed on its own. */
export const maxMemberReplacements = 2;

type BindFailureReason = 'NodeDidNotBind' | 'NodeRejectedBinding';

/** `member 2 (node node_…)`: how conditions and messages name a gang member. */
export function memberName(a: Pick<AllocationView, 'gangIndex' | 'nodeId'>): string {
  return `member ${a.gangIndex ?? 0} (node ${a.nodeId})`;
}

const refused = (a: AllocationView) =>
  a.state === 'failed' || a.state === 'released' || a.state === 'releasing';

/**
 * The gang's binding step, or null when the single-node rules apply unchanged (nothing refused and
 * the deadline not passed, or every member bound). `bindFailure` is the lifecycle's own answer to a
 * failed attempt (pending again, or failed after the last), given the message naming the member.
 */
export function gangBindingAction(
  s: ReservationSnapshot,
  bindFailure: (s: ReservationSnapshot, reason: BindFailureReason, detail: string) => LifecycleAction,
): LifecycleAction | null {
  if ((s.gangSize ?? 1) <= 1 || s.allocations.length === 0) return null;
  const deadline = s.bindDeadline ?? s.now + s.timers.bindTimeoutMs;
  const rejected = s.allocations.filter(refused);
  const late = s.now >= deadline ? s.allocations.filter((a) => a.state !== 'bound' && !refused(a)) : [];
  const failing = [...rejected, ...late];
  if (failing.length === 0) return null;
  const reason: BindFailureReason = rejected.length > 0 ? 'NodeRejectedBinding' : 'NodeDidNotBind';
  const exhausted = failing.find((a) => (a.memberAttempt ?? 0) >= maxMemberReplacements);
  if (exhausted) {
    return bindFailure(
      s,
      reason,
      `gang ${memberName(exhausted)} did not bind after ${maxMemberReplacements} re-placements`,
    );
  }
  return {
    kind: 'replaceGangMembers',
    allocationIds: failing.map((a) => a.id),
    reason,
    bindDeadline: s.now + s.timers.bindTimeoutMs,
  };
}

/** The gang members a lost binding names: not bound, or a later report failed verification. */
export function lostMembers(s: ReservationSnapshot): AllocationView[] {
  return s.allocations.filter((a) => a.state !== 'bound' || a.bindingLost);
}
