// One stack: its verdict and evidence, every frame with file:line, and its sampled bytes.

import { get, type Series, type StackDetail } from './api';
import { SeriesChart } from './charts';
import { el, fill } from './dom';
import { bytes, count, seconds, slope } from './format';

/** " · pages the allocator mapped for them: brk 4.8 MiB, mmap 260 KiB", or nothing. */
function pagesNote(pages: Record<string, number> | undefined): string {
  const parts = Object.entries(pages ?? {}).map(([kind, n]) => `${kind} ${bytes(n)}`);
  return parts.length ? ` · pages the allocator mapped for them: ${parts.join(', ')}` : '';
}

export class StackView {
  private readonly chart: SeriesChart;

  constructor(
    private readonly host: HTMLElement,
    chartHost: HTMLElement,
  ) {
    this.chart = new SeriesChart(chartHost);
  }

  async show(id: string): Promise<void> {
    const path = `api/v1/stacks/${encodeURIComponent(id)}`;
    let s: StackDetail;
    try {
      s = await get<StackDetail>(path);
    } catch (e) {
      fill(this.host, el('p', { class: 'muted' }, `This stack is no longer in the report (${(e as Error).message}).`));
      return;
    }
    const series = await get<Series>(`${path}/series`).catch(() => null);
    const per = series?.per ?? 'second';
    const frames = s.frames.map((f, i) =>
      el(
        'li',
        { class: i === 0 ? 'frame innermost' : 'frame' },
        el('span', { class: 'fn' }, f.function ?? `${f.module ?? '?'}+${f.offset}`),
        f.file ? el('span', { class: 'loc' }, f.line ? `${f.file}:${f.line}` : f.file) : null,
        f.module ? el('span', { class: 'module' }, f.module) : null,
      ),
    );
    fill(
      this.host,
      el(
        'div',
        { class: 'facts' },
        el('span', { class: `verdict ${s.verdict ?? 'none'}` }, s.verdict ?? 'no verdict yet'),
        ` ${s.kind} · pid ${s.pid} · ${bytes(s.bytes)} in ${count(s.blocks)} blocks · oldest ${seconds(s.oldest_age_s)}`,
        s.slope !== null ? ` · ${slope(s.slope, per)}` : '',
        s.confidence !== null ? ` · confidence ${(s.confidence * 100).toFixed(0)}%` : '',
        pagesNote(s.pages),
      ),
      el('ol', { class: 'frames', 'data-id': s.id }, ...frames),
    );
    if (series && series.points.length) this.chart.update(series);
  }

  clear(): void {
    fill(this.host, el('p', { class: 'muted' }, 'Click a stack in the table to see its frames.'));
  }
}
