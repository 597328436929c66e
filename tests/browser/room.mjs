// Drives a waiting room's queue page in headless Chromium.
//
// Env: GATEWAY_URL, ROOM_PATH (a path the room guards, whose one seat a
// visitor inside holds while the page opens), SHOP_TEXT (text of the shop's
// page), ARTIFACTS (screenshot dir).
// The page must show place 1 in line, count down, and, once the seat is
// free, let the visitor into the shop's page by itself (no click).
// Exits non-zero, with a screenshot, on any failure.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const need = (k) => { const v = process.env[k]; if (!v) { console.error(`${k} is not set`); process.exit(2); } return v; };
const gateway = need('GATEWAY_URL'), roomPath = need('ROOM_PATH'), shopText = need('SHOP_TEXT');
const artifacts = process.env.ARTIFACTS || 'target/browser-artifacts/room';
mkdirSync(artifacts, { recursive: true });
const step = (msg) => console.log(`room.mjs: ${msg}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = await (await browser.newContext()).newPage();
page.on('pageerror', (e) => console.error(`script error: ${e.message}`));
try {
  await page.goto(`${gateway}${roomPath}`);
  await page.locator('#fg-place', { hasText: /^1$/ }).waitFor({ timeout: 10_000 });
  step(`queue page: ${await page.locator('h1').textContent()}, place 1`);
  await page.screenshot({ path: join(artifacts, 'queue.png'), fullPage: true });
  const first = Number(await page.locator('#fg-countdown').textContent());
  await page.waitForTimeout(1200);
  const later = Number(await page.locator('#fg-countdown').textContent());
  if (!(later < first)) throw new Error(`the countdown did not count down: ${first} then ${later}`);
  step(`countdown ${first} -> ${later}`);
  await page.getByText(shopText).waitFor({ timeout: 60_000 });
  step(`let in: ${page.url()}`);
  await page.screenshot({ path: join(artifacts, 'let-in.png'), fullPage: true });
} catch (e) {
  await page.screenshot({ path: join(artifacts, 'failed.png'), fullPage: true }).catch(() => {});
  console.error(`room.mjs: ${e.stack || e}`);
  await browser.close();
  process.exit(1);
}
await browser.close();
