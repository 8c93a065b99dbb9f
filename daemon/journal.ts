import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { open, rename } from 'node:fs/promises';
import path from 'node:path';

/**
 * The daemon's journal: every command it accepted and how far it got, and the NodeSpec generation
 * it converged, under a `journalId`. Written atomically (temp file, fsync, rename) before and after
 * each side effect, so a restarted bcd never runs one twice. Writes are asynchronous (many agents
 * share one event loop in `bcd sim`) and coalesced: each change's promise resolves once a write
 * containing it is durable. A missing or unreadable journal starts a new id, which tells the
 * gateway to fail what the old one had in flight. Bounded: the oldest finished entries are dropped
 * past `maxEntries`.
 */

export type JournalState = 'started' | 'done';

export interface JournalEntry {
  seq: number;
  kind: string;
  state: JournalState;
  outcome?: number;
  result?: string;
  error?: string;
}

interface JournalFile {
  journalId: string;
  convergedGeneration: number;
  lastAckedSeq: number;
  commands: Record<string, JournalEntry>;
}

export class Journal {
  private data: JournalFile;
  private readonly file: string;
  private chain: Promise<void> = Promise.resolve();
  private version = 0;
  private written = 0;

  constructor(
    dir: string,
    private readonly maxEntries = 1_000,
  ) {
    mkdirSync(dir, { recursive: true });
    this.file = path.join(dir, 'journal.json');
    const existing = Journal.read(this.file);
    this.data = existing ?? {
      journalId: `jrn_${randomBytes(12).toString('hex')}`,
      convergedGeneration: 0,
      lastAckedSeq: 0,
      commands: {},
    };
    if (!existing) this.version = 1;
  }

  private static read(file: string): JournalFile | null {
    if (!existsSync(file)) return null;
    try {
      const parsed = JSON.parse(readFileSync(file, 'utf8')) as JournalFile;
      if (typeof parsed.journalId !== 'string' || typeof parsed.commands !== 'object') return null;
      return parsed;
    } catch {
      return null;
    }
  }

  get journalId(): string {
    return this.data.journalId;
  }

  get convergedGeneration(): number {
    return this.data.convergedGeneration;
  }

  get lastAckedSeq(): number {
    return this.data.lastAckedSeq;
  }

  entry(commandId: string): JournalEntry | undefined {
    return this.data.commands[commandId];
  }

  /** Records that a side effect is about to run; resolves once that is durable. */
  start(commandId: string, seq: number, kind: string): Promise<void> {
    this.data.commands[commandId] = { seq, kind, state: 'started' };
    return this.persist();
  }

  finish(
    commandId: string,
    seq: number,
    kind: string,
    outcome: number,
    result?: string,
    error?: string,
  ): Promise<void> {
    this.data.commands[commandId] = { seq, kind, state: 'done', outcome, result, error };
    if (seq > this.data.lastAckedSeq) this.data.lastAckedSeq = seq;
    this.trim();
    return this.persist();
  }

  converged(generation: number): Promise<void> {
    if (generation === this.data.convergedGeneration) return Promise.resolve();
    this.data.convergedGeneration = generation;
    return this.persist();
  }

  /** Resolves once everything recorded so far is on disk (a fresh journal included). */
  persist(): Promise<void> {
    const target = ++this.version;
    this.chain = this.chain.then(async () => {
      if (this.written >= target) return;
      const version = this.version;
      await this.write(JSON.stringify(this.data));
      this.written = version;
    });
    return this.chain;
  }

  private trim(): void {
    const ids = Object.keys(this.data.commands);
    if (ids.length <= this.maxEntries) return;
    const done = ids
      .filter((id) => this.data.commands[id]!.state === 'done')
      .sort((a, b) => this.data.commands[a]!.seq - this.data.commands[b]!.seq);
    for (const id of done.slice(0, ids.length - this.maxEntries)) delete this.data.commands[id];
  }

  private async write(content: string): Promise<void> {
    const tmp = `${this.file}.tmp`;
    const handle = await open(tmp, 'w');
    try {
      await handle.writeFile(content);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(tmp, this.file);
  }
}
