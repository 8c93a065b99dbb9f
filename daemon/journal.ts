import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  writeSync,
} from 'node:fs';
import path from 'node:path';

/**
 * The daemon's journal: every command it accepted and how far it got, and the NodeSpec generation
 * it converged, under a `journalId`. Written atomically (temp file, fsync, rename) before and after
 * each side effect, so a restarted bcd never runs one twice. A missing or unreadable journal starts
 * a new id, which tells the gateway to fail what the old one had in flight. Bounded: the oldest
 * finished entries are dropped past `maxEntries`.
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

  constructor(
    dir: string,
    private readonly maxEntries = 1_000,
  ) {
    mkdirSync(dir, { recursive: true });
    this.file = path.join(dir, 'journal.json');
    this.data = Journal.read(this.file) ?? {
      journalId: `jrn_${randomBytes(12).toString('hex')}`,
      convergedGeneration: 0,
      lastAckedSeq: 0,
      commands: {},
    };
    this.flush();
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

  /** Records that a side effect is about to run (durable before it runs). */
  start(commandId: string, seq: number, kind: string): void {
    this.data.commands[commandId] = { seq, kind, state: 'started' };
    this.flush();
  }

  finish(
    commandId: string,
    seq: number,
    kind: string,
    outcome: number,
    result?: string,
    error?: string,
  ): void {
    this.data.commands[commandId] = { seq, kind, state: 'done', outcome, result, error };
    if (seq > this.data.lastAckedSeq) this.data.lastAckedSeq = seq;
    this.trim();
    this.flush();
  }

  converged(generation: number): void {
    if (generation === this.data.convergedGeneration) return;
    this.data.convergedGeneration = generation;
    this.flush();
  }

  private trim(): void {
    const ids = Object.keys(this.data.commands);
    if (ids.length <= this.maxEntries) return;
    const done = ids
      .filter((id) => this.data.commands[id]!.state === 'done')
      .sort((a, b) => this.data.commands[a]!.seq - this.data.commands[b]!.seq);
    for (const id of done.slice(0, ids.length - this.maxEntries)) delete this.data.commands[id];
  }

  private flush(): void {
    const tmp = `${this.file}.tmp`;
    const fd = openSync(tmp, 'w');
    try {
      writeSync(fd, JSON.stringify(this.data));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.file);
  }
}
