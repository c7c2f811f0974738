// The explorer API's types (as tracer/src/api/dto.rs and views.rs write them) and a fetch that
// carries the token the page was opened with.

export type Bytes = Record<string, number>;

export interface Health {
  live: boolean;
  final: boolean;
  /// What slopes are per: "second" or "step".
  per: string;
  elapsed_s: number;
  events: number;
  steps: number;
  losses: Record<string, number>;
  dropped: number;
  map_fill: { name: string; used: number; capacity: number; peak?: number }[];
  libraries: { path: string; roles: string[]; when: string }[];
  /// Probe sets that could not go in: those libraries' calls are not traced.
  probe_failures: { library: string; role: string; error: string }[];
  /// What the heap figures are (sampled estimates, not traced, traced late); empty when exact.
  heap: string[];
  /// --probe-cost: leaktracer's programs' runs and kernel time, the costliest first.
  probe_cost: { program: string; calls: number; ns: number }[];
  /// How many stacks the report lists (--top, and every leak).
  stacks_listed: number;
  /// The stacks it leaves out: how many, and their bytes and blocks per kind.
  unlisted: { stacks: number; totals: Record<string, { bytes: number; blocks: number }> };
}

export interface Update {
  elapsed_s: number;
  events: number;
  steps: number;
  totals: Bytes;
  leaks: number;
  dropped: number;
  final: boolean;
}

export interface Process {
  pid: number;
  ppid: number | null;
  command: string;
  exited: boolean;
  bytes: Bytes;
  inherited: Bytes;
  retention: boolean;
}

export interface Stack {
  id: string;
  pid: number;
  kind: string;
  inherited: boolean;
  bytes: number;
  blocks: number;
  oldest_age_s: number;
  verdict: string | null;
  slope: number | null;
  confidence: number | null;
  released: boolean;
  site: string;
  /** Pages the allocator mapped for these blocks, by page kind (brk, mmap). */
  pages: Record<string, number>;
}

export interface Frame {
  function: string | null;
  file: string | null;
  line: number | null;
  module: string | null;
  offset: string;
}

export interface StackDetail extends Stack {
  frames: Frame[];
  windows: { t0: number; t1: number; floor: number; peak: number }[];
}

export interface Point {
  t0: number;
  t1: number;
  min: number;
  max: number;
  last: number;
}

export interface Series {
  per: 'second' | 'step';
  points: Point[];
}

export interface Timeline {
  t: number[];
  steps: number[];
  leaks: number[];
  kinds: Record<string, number[]>;
}

export interface FlameNode {
  name: string;
  loc?: string;
  value: number;
  leak: number;
  children: FlameNode[];
}

export interface Run {
  id: number;
  started_unix: number;
  ended_unix: number | null;
  mode: string;
  command: string;
  root_pid: number;
  exit_code: number | null;
  snapshots: number;
}

export interface SnapshotRow {
  seq: number;
  reason: string;
  taken_unix: number;
  stacks: number;
}

export interface StackDelta {
  kind: string;
  frames: string[];
  old_bytes: number;
  new_bytes: number;
  delta_bytes: number;
  old_blocks: number;
  new_blocks: number;
  change: string;
}

/// The token from the page's own URL (`?token=…`), sent with every request for data.
const token = new URLSearchParams(location.search).get('token');

/// An error the API answered with (its message is for the user).
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export async function get<T>(path: string): Promise<T> {
  const headers: Record<string, string> = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(path, { headers, cache: 'no-store' });
  const body = await res.json().catch(() => null);
  if (!res.ok) throw new ApiError(res.status, (body && body.error) || res.statusText);
  return body as T;
}

/// The live updates' URL (EventSource sends no headers: the token goes in the query).
export function eventsUrl(): string {
  return token ? `api/v1/events?token=${encodeURIComponent(token)}` : 'api/v1/events';
}
