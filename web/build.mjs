// Builds the explorer page into dist/: index.html, app.js and app.css (uPlot, d3-flame-graph and
// the page's own code bundled and minified), and prints each file's size.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { readFileSync } from 'node:fs';

const out = new URL('./dist/', import.meta.url).pathname;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: 'src/main.ts' },
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  outdir: out,
  legalComments: 'none',
  logLevel: 'warning',
});
copyFileSync('index.html', out + 'index.html');
let total = 0;
let gz = 0;
for (const f of readdirSync(out).sort()) {
  const size = statSync(out + f).size;
  const zipped = gzipSync(readFileSync(out + f)).length;
  total += size;
  gz += zipped;
  console.log(`  ${f.padEnd(12)} ${(size / 1024).toFixed(1).padStart(7)} KiB  (${(zipped / 1024).toFixed(1)} KiB gzipped)`);
}
console.log(`  ${'total'.padEnd(12)} ${(total / 1024).toFixed(1).padStart(7)} KiB  (${(gz / 1024).toFixed(1)} KiB gzipped)`);
