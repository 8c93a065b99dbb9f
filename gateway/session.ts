import { type Metadata, type ServerDuplexStream, status } from '@grpc/grpc-js';
import type { Logger } from '../core/logger.ts';
import type { PeerCertificateRow } from '../db/nodes/certificates.ts';
import type { QueuedCommandRow } from '../db/nodes/commands.ts';
import { releaseSessionGateway } from '../db/nodes/sessions.ts';
import { assertNever, ComputeError, errorCodeTraits, isComputeError } from '../domain/errors.ts';
import type { CommandLane } from '../domain/fleet.ts';
import type {
  AgentMessage,
  CommandResult,
  ControlMessage,
  Hello,
  SpecStatus,
} from '../proto/gen/agent/v1/agent.ts';
import type { GatewayContext } from './context.ts';
import { isSessionFenced } from './fence.ts';
import { applyInventory, parseInventory } from './inventory.ts';
import { checkAgentMessage } from './message-bounds.ts';
import { laneToProto } from './options.ts';
import type { RegisteredSession } from './registry.ts';
import { acceptAllocationReport } from './reports.ts';
import { openSession, welcomeFor } from './session-open.ts';
import { recordCommandResult, recordObservedGeneration } from './session-records.ts';
import { commandPayloadForWire } from './site-agents.ts';
import { SpecSender } from './spec-sender.ts';
import { TokenBucket } from './token-bucket.ts';
import { recordUpdateStatus } from './update-status.ts';
import { wakeMetalWorkflow, wakeReservations, wakeReservationsOnNodes } from './wake.ts';

type Stream = ServerDuplexStream<AgentMessage, ControlMessage>;

/**
 * One node's session on this gateway: Hello and Welcome, then heartbeats, inventory, spec status,
 * command results and reports, each handled one at a time (a flooding node holds at most one
 * database connection) under a per-session token bucket, every field within its bound
 * (`checkAgentMessage`), reports and inventory within the node's own budgets. Every write carries
 * the session's epoch. Until its Hello the connection holds no session slot (the registry counts
 * it per node) and it is closed when no Hello came within `helloTimeoutMs`.
 */
export class NodeSession implements RegisteredSession {
  nodeId: string;
  epoch = 0;
  journalId = '';
  lastSeenMs = Date.now(); // wall time: the in-process liveness lease of this stream
  private readonly spec = new SpecSender();
  observedGeneration = 0;
  /** Commands delivered on this session and not yet answered, by id. */
  readonly inFlight = new Map<string, { seq: number; lane: CommandLane }>();
  private heartbeats = 0;
  private readonly bucket: TokenBucket;
  private refusals = 0;
  private chain: Promise<void> = Promise.resolve();
  private pending = 0;
  private opened = false;
  /** Counted by the registry as waiting for its Hello (until the Hello or the end). */
  private awaitingHello = true;
  /** Holds one of the registry's session slots while it opens. */
  private admitted = false;
  closed = false;
  /** Ended by the gateway (`end`), not by the stream. */
  private endedHere = false;
  readonly log: Logger;

  constructor(
    private readonly ctx: GatewayContext,
    private readonly call: Stream,
    readonly peer: PeerCertificateRow,
  ) {
    this.nodeId = peer.nodeId;
    this.bucket = new TokenBucket(ctx.options.messagesPerSecond, ctx.options.messageBurst);
    this.log = ctx.log.child({ nodeId: peer.nodeId, nodeName: peer.nodeName });
  }

  /** Runs the session until the stream ends. */
  run(): void {
    const helloTimer = setTimeout(() => {
      if (this.awaitingHello) {
        this.log.info(
          { helloTimeoutMs: this.ctx.options.helloTimeoutMs },
          'session closed: no Hello in time',
        );
        this.end(status.DEADLINE_EXCEEDED, 'no Hello in time');
      }
    }, this.ctx.options.helloTimeoutMs);
    helloTimer.unref();
    this.call.on('data', (message: AgentMessage) => {
      this.lastSeenMs = Date.now(); // wall time: the in-process liveness lease of this stream
      if (!this.bucket.take()) {
        this.refuse('RATE_LIMITED', 'per-session message rate exceeded', message.body?.$case ?? 'unknown');
        return;
      }
      if (this.pending >= 64) {
        this.refuse('RATE_LIMITED', 'too many messages waiting', message.body?.$case ?? 'unknown');
        return;
      }
      this.pending++;
      this.chain = this.chain
        .then(() => this.handle(message))
        .catch((error: unknown) => this.onError(error, message))
        .finally(() => {
          this.pending--;
        });
    });
    this.call.on('error', (err: Error & { code?: number }) => {
      // `end` emits its own status as an error (a refusal at the limit is RESOURCE_EXHAUSTED): only
      // an error the stream raised itself says the node sent something malformed or oversized.
      const badInput =
        !this.endedHere && (err.code === status.INTERNAL || err.code === status.RESOURCE_EXHAUSTED);
      this.log[badInput ? 'warn' : 'debug'](
        { err: err.message, code: err.code, epoch: this.epoch },
        badInput ? 'session ended: malformed or oversized message' : 'session stream ended',
      );
      this.finish();
    });
    this.call.on('end', () => {
      clearTimeout(helloTimer);
      this.finish();
      if (!this.closed) {
        this.closed = true;
        this.call.end();
      }
    });
    this.call.on('cancelled', () => this.finish());
    this.call.on('close', () => clearTimeout(helloTimer));
  }

  private refuse(code: string, message: string, subject: string): void {
    this.refusals++;
    this.log.warn({ code, subject, epoch: this.epoch }, `refused: ${message}`);
    this.send({ body: { $case: 'refusal', value: { code, message, subject } } });
    if (this.refusals > this.ctx.options.maxRefusals) {
      this.end(status.RESOURCE_EXHAUSTED, 'too many refused messages');
    }
  }

  private onError(error: unknown, message: AgentMessage): void {
    const subject = message.body?.$case ?? 'unknown';
    if (isSessionFenced(error)) {
      this.fence('a newer session holds the node');
      return;
    }
    if (isComputeError(error)) {
      this.refuse(error.code, error.message, subject);
      return;
    }
    const unavailable = this.ctx.outage.unavailable(error, 'session message');
    if (unavailable) {
      // Not the node's fault: neither a warn line nor a count toward its refusal limit.
      this.send({
        body: { $case: 'refusal', value: { code: unavailable.code, message: unavailable.message, subject } },
      });
      return;
    }
    this.log.error({ err: error, subject }, 'session message failed');
    this.refuse('INTERNAL', 'internal error', subject);
  }

  send(message: ControlMessage): void {
    if (this.closed) return;
    this.call.write(message);
  }

  /** Ends the stream with a status (the node reconnects and gets a new epoch). */
  end(code: number, details: string, metadata?: Metadata): void {
    if (this.closed) return;
    this.closed = true;
    this.endedHere = true;
    this.call.emit('error', { code, details, ...(metadata ? { metadata } : {}) });
    this.finish();
  }

  private helloDone(): void {
    if (!this.awaitingHello) return;
    this.awaitingHello = false;
    this.ctx.registry.helloDone(this.nodeId);
  }

  fence(reason: string): void {
    this.log.info({ epoch: this.epoch, reason }, 'session fenced');
    this.end(status.ABORTED, reason);
  }

  private finished = false;
  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    this.helloDone();
    if (this.admitted && !this.opened) {
      this.admitted = false;
      this.ctx.registry.released();
    }
    if (this.opened && this.ctx.registry.isCurrent(this)) {
      this.ctx.registry.detach(this);
      void releaseSessionGateway(this.ctx.db, {
        nodeId: this.nodeId,
        epoch: this.epoch,
        gatewayId: this.ctx.options.gatewayId,
      }).catch(() => {});
    }
  }

  private async handle(message: AgentMessage): Promise<void> {
    if (this.closed) return;
    const body = message.body;
    if (!this.opened) {
      // A session that cannot open ends at once with the refusal's status.
      try {
        if (body?.$case !== 'hello')
          throw new ComputeError('INVALID_INPUT', 'the first message must be Hello');
        checkAgentMessage(message);
        this.helloDone();
        const refusal = this.ctx.registry.admit(this.nodeId);
        if (refusal) {
          this.log.debug({ code: refusal.code }, 'session refused at the limit');
          this.end(refusal.code, refusal.details, refusal.metadata);
          return;
        }
        this.admitted = true;
        await this.open(body.value);
      } catch (thrown) {
        const unavailable = isComputeError(thrown)
          ? null
          : this.ctx.outage.unavailable(thrown, 'session open');
        const error = unavailable ?? thrown;
        const code = isComputeError(error) ? errorCodeTraits[error.code].grpcStatus : status.INTERNAL;
        const message = isComputeError(error) ? error.message : 'internal error';
        if (!isComputeError(error)) this.log.error({ err: error }, 'session open failed');
        // An outage is logged once by ctx.outage; the node reconnects when it is over.
        this.log[unavailable ? 'debug' : 'warn']({ code, reason: message }, 'session refused at Hello');
        this.end(code, message);
      }
      return;
    }
    if (!body) throw new ComputeError('INVALID_INPUT', 'empty message');
    checkAgentMessage(message);
    switch (body.$case) {
      case 'hello':
        throw new ComputeError('INVALID_INPUT', 'Hello was already received');
      case 'heartbeat':
        this.ctx.registry.heard.set(this.nodeId, this.epoch);
        // One heartbeat in six is answered (round trip and clock samples); the rest cost no write.
        if (this.heartbeats++ % 6 === 0) {
          this.send({
            body: {
              $case: 'heartbeatAck',
              // wall time: a clock sample for the node's round-trip and skew estimate, never stored
              value: { sentAtMs: body.value.sentAtMs, serverTimeMs: Date.now() },
            },
          });
        }
        if (body.value.observedGeneration !== this.observedGeneration) {
          await this.observe({ observedGeneration: body.value.observedGeneration, error: '' });
        }
        return;
      case 'inventory': {
        if (!this.ctx.rates.take('inventory', this.nodeId)) {
          throw new ComputeError(
            'RATE_LIMITED',
            'inventory reports beyond the node’s rate; nothing was stored',
          );
        }
        const sections = parseInventory(body.value.sections);
        const applied = await applyInventory(this.ctx.db, {
          nodeId: this.nodeId,
          epoch: this.epoch,
          sections,
        });
        // GPUs' health and the host's ForeignGpuExposure both change what active reservations show.
        if (sections.gpus || sections.host) {
          void wakeReservations(this.ctx, applied.liveReservationIds, 'node-inventory-changed');
        }
        return;
      }
      case 'specStatus':
        await this.observe(body.value);
        return;
      case 'commandResult':
        await this.completeCommand(body.value);
        return;
      case 'report': {
        try {
          if (!this.ctx.rates.take('report', this.nodeId)) {
            throw new ComputeError(
              'RATE_LIMITED',
              'allocation reports beyond the node’s rate; nothing was stored',
            );
          }
          const accepted = await acceptAllocationReport(this.ctx, {
            nodeId: this.nodeId,
            epoch: this.epoch,
            report: body.value,
          });
          this.send({
            body: {
              $case: 'reportAck',
              value: { allocationId: accepted.allocationId, accepted: true, reason: '' },
            },
          });
        } catch (error) {
          if (isComputeError(error) && !isSessionFenced(error)) {
            this.send({
              body: {
                $case: 'reportAck',
                value: { allocationId: '', accepted: false, reason: error.message },
              },
            });
          }
          throw error;
        }
        return;
      }
      case 'updateStatus':
        await recordUpdateStatus(this.ctx.db, this, body.value);
        return;
      default:
        return assertNever(body);
    }
  }

  private async open(hello: Hello): Promise<void> {
    if (hello.nodeId !== this.nodeId) {
      throw new ComputeError('ACCESS_DENIED', 'Hello names another node than the certificate');
    }
    const opened = await openSession(this.ctx, this.nodeId, hello);
    this.epoch = opened.epoch;
    this.journalId = hello.journalId;
    this.observedGeneration = Number(hello.observedGeneration);
    this.opened = true;
    this.admitted = false;
    this.ctx.registry.released();
    this.ctx.registry.attach(this);
    this.log.info(
      { epoch: this.epoch, journalId: this.journalId, failedInFlight: opened.failedInFlight },
      'session opened',
    );
    this.send({ body: { $case: 'welcome', value: welcomeFor(this.ctx.options, opened) } });
    this.pushSpec(opened.generation, opened.spec);
    if (opened.wasUnreachable) void wakeReservationsOnNodes(this.ctx, [this.nodeId], 'node-reconnected');
    wakeMetalWorkflow(this.ctx, opened.metalWorkflowId, 'agent joined');
    for (const command of opened.redeliver) this.deliver(command);
    this.ctx.commands?.sessionOpened(this.nodeId);
  }

  /** Sends the spec if it is newer than what this session sent: a patch when it can. */
  pushSpec(generation: number, spec: Record<string, unknown>): void {
    const update = this.spec.next(generation, spec);
    if (update) this.send({ body: { $case: 'spec', value: update } });
  }

  get sentGeneration(): number {
    return this.spec.sentGeneration;
  }

  /** Free credits per lane. */
  credits(): Record<CommandLane, number> {
    const free = { ...this.ctx.options.credits };
    for (const { lane } of this.inFlight.values()) free[lane]--;
    return free;
  }

  deliver(command: QueuedCommandRow): void {
    this.inFlight.set(command.id, { seq: command.seq, lane: command.lane });
    this.send({
      body: {
        $case: 'command',
        value: {
          id: command.id,
          seq: command.seq,
          kind: command.kind,
          lane: laneToProto[command.lane],
          payloadJson: Buffer.from(JSON.stringify(commandPayloadForWire(this.ctx, command))),
          notBeforeMs: command.notBefore?.getTime() ?? 0,
          notAfterMs: command.notAfter?.getTime() ?? 0,
          minGeneration: command.minGeneration ?? 0,
        },
      },
    });
  }

  private async observe(statusMessage: SpecStatus): Promise<void> {
    const generation = Number(statusMessage.observedGeneration);
    if (statusMessage.error) {
      this.log.warn(
        { generation, error: statusMessage.error.slice(0, 500) },
        'node did not converge its spec',
      );
      if (statusMessage.error.startsWith('base-mismatch')) this.spec.reset();
      return;
    }
    if (generation < this.observedGeneration) {
      throw new ComputeError(
        'INVALID_INPUT',
        `observed generation went backwards (${generation} < ${this.observedGeneration})`,
      );
    }
    if (generation > this.sentGeneration) {
      throw new ComputeError('INVALID_INPUT', `observed generation ${generation} was never sent`);
    }
    this.observedGeneration = generation;
    this.ctx.commands?.nodeProgressed(this.nodeId);
    await recordObservedGeneration(this.ctx.db, this, generation);
  }

  private async completeCommand(result: CommandResult): Promise<void> {
    const id = result.commandId;
    const known = this.inFlight.get(id);
    if (known && known.seq !== Number(result.seq)) {
      throw new ComputeError('INVALID_INPUT', `command ${id} has seq ${known.seq}, not ${result.seq}`);
    }
    const stored = await recordCommandResult(this.ctx.db, this, { ...result, commandId: id }, this.peer);
    if (this.inFlight.delete(id)) this.ctx.commands?.nodeProgressed(this.nodeId);
    if (stored) {
      wakeMetalWorkflow(this.ctx, stored.metalWorkflowId, 'command answered');
      this.ctx.onCommandCompleted?.(id);
    }
  }
}
