// Two stored snapshots side by side: what grew, shrank, appeared or vanished between them.

import { get, type Run, type SnapshotRow, type StackDelta } from './api';
import { byId, el, fill } from './dom';
import { bytes, signedBytes, when } from './format';

export class DiffView {
  private readonly run = byId<HTMLSelectElement>('diff-run');
  private readonly old = byId<HTMLSelectElement>('diff-old');
  private readonly new = byId<HTMLSelectElement>('diff-new');
  private readonly go = byId<HTMLButtonElement>('diff-go');
  private runs: Run[] = [];
  /// The snapshots the user picked; untouched, old is the first and new the latest.
  private picked = { old: false, new: false };

  constructor(
    private readonly host: HTMLTableElement,
    private readonly note: HTMLElement,
  ) {
    this.run.addEventListener('change', () => {
      this.picked = { old: false, new: false };
      void this.loadSnapshots();
    });
    this.old.addEventListener('change', () => (this.picked.old = true));
    this.new.addEventListener('change', () => (this.picked.new = true));
    this.go.addEventListener('click', () => void this.compare());
  }

  /// Refreshes the runs and the snapshots of the chosen one, keeping the choices made.
  async refresh(): Promise<void> {
    try {
      this.runs = await get<Run[]>('api/v1/runs');
    } catch (e) {
      this.say((e as Error).message);
      return;
    }
    const chosen = this.run.value;
    fill(
      this.run,
      ...this.runs
        .slice()
        .reverse()
        .map((r) => el('option', { value: r.id }, `run ${r.id}: ${r.command}`)),
    );
    if (chosen && this.runs.some((r) => String(r.id) === chosen)) this.run.value = chosen;
    await this.loadSnapshots();
  }

  private async loadSnapshots(): Promise<void> {
    if (!this.run.value) return this.say('No run is stored yet.');
    const snaps = await get<SnapshotRow[]>(`api/v1/runs/${this.run.value}/snapshots`).catch(() => []);
    for (const [select, fallback, picked] of [
      [this.old, snaps[0], this.picked.old],
      [this.new, snaps[snaps.length - 1], this.picked.new],
    ] as const) {
      const prev = picked ? select.value : '';
      fill(
        select,
        ...snaps.map((s) => el('option', { value: s.seq }, `#${s.seq} ${s.reason} ${when(s.taken_unix)}`)),
      );
      if (prev && snaps.some((s) => String(s.seq) === prev)) select.value = prev;
      else if (fallback) select.value = String(fallback.seq);
    }
    this.go.disabled = snaps.length < 2;
    this.say(snaps.length < 2 ? 'A diff needs two snapshots of the run (one is stored every --snapshot seconds).' : '');
  }

  private async compare(): Promise<void> {
    const run = this.run.value;
    const q = `old=run:${run}:${this.old.value}&new=run:${run}:${this.new.value}`;
    let deltas: StackDelta[];
    try {
      deltas = await get<StackDelta[]>(`api/v1/diff?${q}`);
    } catch (e) {
      this.say((e as Error).message);
      return;
    }
    const changed = deltas.filter((d) => d.change !== 'same');
    fill(
      this.host,
      el(
        'thead',
        {},
        el('tr', {}, ...['Change', 'Kind', 'Innermost frames', 'Old', 'New', 'Delta'].map((h) => el('th', {}, h))),
      ),
      el(
        'tbody',
        {},
        ...changed.map((d) =>
          el(
            'tr',
            { class: d.change },
            el('td', {}, d.change),
            el('td', {}, d.kind),
            el('td', { class: 'site' }, d.frames.slice(0, 3).join(' ← ')),
            el('td', { class: 'num' }, bytes(d.old_bytes)),
            el('td', { class: 'num' }, bytes(d.new_bytes)),
            el('td', { class: `num delta ${d.delta_bytes > 0 ? 'up' : 'down'}` }, signedBytes(d.delta_bytes)),
          ),
        ),
      ),
    );
    this.host.dataset.rows = String(changed.length);
    this.say(changed.length ? '' : 'Nothing changed between these snapshots.');
  }

  private say(text: string): void {
    this.note.textContent = text;
  }
}
