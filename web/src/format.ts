// Numbers as people read them.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function bytes(n: number): string {
  const sign = n < 0 ? '−' : '';
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  return `${sign}${i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)} ${UNITS[i]}`;
}

export function signedBytes(n: number): string {
  return n > 0 ? `+${bytes(n)}` : bytes(n);
}

export function seconds(s: number): string {
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function count(n: number): string {
  return n.toLocaleString('en-US');
}

export function slope(v: number | null, per: string): string {
  return v === null ? '' : `${signedBytes(Math.round(v))}/${per === 'step' ? 'step' : 's'}`;
}

export function when(unix: number): string {
  return new Date(unix * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

/// The groups the page shows bytes in: what the allocator hands out, pages mapped, GPU memory.
export const GROUPS: Record<string, string[]> = {
  heap: ['heap', 'tensor'],
  pages: ['mmap', 'brk'],
  device: ['device', 'managed', 'pinned', 'torch_block'],
};

export function grouped(b: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [g, kinds] of Object.entries(GROUPS)) {
    out[g] = kinds.reduce((sum, k) => sum + (b[k] ?? 0), 0);
  }
  return out;
}
