// The page's load time in Chromium against a running explorer: from navigation start to the
// top-stacks table, the timeline and the flamegraph first in the DOM (timed in the page by a
// mutation observer, not by the driver's polling), over N loads in fresh browser contexts (median
// and worst), with the bundle's size. Used by scripts/bench-ui.sh.
//
//   node tests/pageload.mjs URL [N]
import { chromium } from 'playwright-core';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

const [url, runs = '10'] = process.argv.slice(2);
if (!url) {
  console.error('usage: node tests/pageload.mjs URL [N]');
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run'],
});
const times = { dom: [], table: [], drawn: [] };
for (let i = 0; i < Number(runs); i++) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  await page.addInitScript(() => {
    const seen = (window.__firstSeen = {});
    new MutationObserver(() => {
      const now = performance.now();
      if (!seen.table && document.querySelector('#stacks tbody tr[data-id]')) seen.table = now;
      if (!seen.flame && document.querySelector('#flame svg g')) seen.flame = now;
      if (!seen.timeline && document.querySelector('#timeline canvas')) seen.timeline = now;
    }).observe(document, { subtree: true, childList: true });
  });
  await page.goto(url, { waitUntil: 'domcontentloaded' });
  await page.waitForFunction(() => {
    const s = window.__firstSeen;
    return s.table && s.flame && s.timeline;
  });
  const s = await page.evaluate(() => ({
    dom: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd,
    ...window.__firstSeen,
  }));
  times.dom.push(Math.round(s.dom));
  times.table.push(Math.round(s.table));
  times.drawn.push(Math.round(Math.max(s.table, s.flame, s.timeline)));
  await context.close();
}
await browser.close();
const stat = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return `median ${s[Math.floor(s.length / 2)]} ms, worst ${s[s.length - 1]} ms`;
};
console.log(`page load over ${runs} fresh loads:`);
console.log(`    DOM ready                                   ${stat(times.dom)}`);
console.log(`    top-stacks table filled                     ${stat(times.table)}`);
console.log(`    timeline and flamegraph drawn too           ${stat(times.drawn)}`);
const dist = new URL('../dist/', import.meta.url).pathname;
let raw = 0;
let gz = 0;
for (const f of readdirSync(dist)) {
  raw += statSync(dist + f).size;
  gz += gzipSync(readFileSync(dist + f)).length;
}
console.log(`bundle (web/dist, embedded in the binary): ${(raw / 1024).toFixed(1)} KiB, ${(gz / 1024).toFixed(1)} KiB gzipped`);
