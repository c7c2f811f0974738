// Time charts with uPlot: the session's timeline of outstanding bytes by kind, with leak and step
// markers, and one stack's series.

import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { Series, Timeline } from './api';
import { bytes } from './format';

export const KIND_COLORS: Record<string, string> = {
  heap: '#2b6cb0',
  tensor: '#805ad5',
  mmap: '#dd6b20',
  brk: '#b7791f',
  device: '#2f855a',
  managed: '#38a169',
  pinned: '#319795',
  torch_block: '#d53f8c',
};

export interface Line {
  label: string;
  color: string;
  values: number[];
  dash?: number[];
}

/// A uPlot chart that keeps its instance while the set of lines stays the same.
class LineChart {
  private plot: uPlot | null = null;
  private shape = '';
  private markers: (u: uPlot) => void = () => {};

  constructor(
    private readonly host: HTMLElement,
    private readonly height: number,
    private readonly xLabel: () => string,
  ) {
    new ResizeObserver(() => this.plot?.setSize(this.size())).observe(host);
  }

  private size() {
    return { width: Math.max(this.host.clientWidth, 200), height: this.height };
  }

  draw(x: number[], lines: Line[], markers?: (u: uPlot) => void): void {
    this.markers = markers ?? (() => {});
    this.host.dataset.points = String(x.length);
    const data: uPlot.AlignedData = [x, ...lines.map((l) => l.values)];
    const shape = lines.map((l) => l.label).join('|') + this.xLabel();
    if (this.plot && shape === this.shape) {
      this.plot.setData(data);
      return;
    }
    this.plot?.destroy();
    this.shape = shape;
    const opts: uPlot.Options = {
      ...this.size(),
      scales: { x: { time: false } },
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      axes: [
        { label: this.xLabel(), stroke: '#555' },
        { stroke: '#555', size: 86, values: (_u, vals) => vals.map((v) => bytes(v)) },
      ],
      series: [
        { label: this.xLabel() },
        ...lines.map((l) => ({
          label: l.label,
          stroke: l.color,
          width: 2,
          dash: l.dash,
          points: { show: x.length < 60 },
          value: (_u: uPlot, v: number | null) => (v === null ? '' : bytes(v)),
        })),
      ],
      hooks: { draw: [(u: uPlot) => this.markers(u)] },
    };
    this.plot = new uPlot(opts, data, this.host);
  }
}

/// The session's outstanding bytes by kind. A red line where a stack was first judged a leak, a
/// tick under the axis at each training step (thinned to at most one per 4 pixels).
export class TimelineChart {
  private chart: LineChart;

  constructor(host: HTMLElement) {
    this.chart = new LineChart(host, 240, () => 'seconds since start');
  }

  update(t: Timeline): void {
    const lines = Object.entries(t.kinds).map(([kind, values]) => ({
      label: kind,
      color: KIND_COLORS[kind] ?? '#444',
      values,
    }));
    this.chart.draw(t.t, lines, (u) => drawMarkers(u, t));
  }
}

function drawMarkers(u: uPlot, t: Timeline): void {
  const ctx = u.ctx;
  const { top, height, left, width } = u.bbox;
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
  ctx.lineWidth = 1.5 * devicePixelRatio;
  ctx.strokeStyle = 'rgba(200, 30, 30, 0.8)';
  ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
  for (let i = 1; i < t.t.length; i++) {
    if (t.leaks[i] > t.leaks[i - 1]) {
      const x = u.valToPos(t.t[i], 'x', true);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
    }
  }
  ctx.setLineDash([]);
  ctx.strokeStyle = 'rgba(60, 60, 60, 0.6)';
  ctx.lineWidth = 1 * devicePixelRatio;
  let lastX = -Infinity;
  for (let i = 1; i < t.t.length; i++) {
    if (t.steps[i] === t.steps[i - 1]) continue;
    const x = u.valToPos(t.t[i], 'x', true);
    if (x - lastX < 4 * devicePixelRatio) continue;
    lastX = x;
    ctx.beginPath();
    ctx.moveTo(x, top + height - 6 * devicePixelRatio);
    ctx.lineTo(x, top + height);
    ctx.stroke();
  }
  ctx.restore();
}

/// One stack's sampled bytes: the floor (least in each span) under the peak (most).
export class SeriesChart {
  private chart: LineChart;
  private per = 'second';

  constructor(host: HTMLElement) {
    this.chart = new LineChart(host, 180, () => (this.per === 'step' ? 'step' : 'seconds'));
  }

  update(s: Series): void {
    this.per = s.per;
    const x = s.points.map((p) => p.t1);
    this.chart.draw(x, [
      { label: 'floor', color: '#c53030', values: s.points.map((p) => p.min) },
      { label: 'peak', color: '#718096', values: s.points.map((p) => p.max), dash: [5, 4] },
    ]);
  }
}
