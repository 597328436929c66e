// Drives a real shop (django-oscar) through the gateway in headless
// Chromium: home, a product, sign-in, add to basket, the basket; then a
// second browser (another client, no cookies) opens the signed-in pages.
//
// Env: GATEWAY_URL, PRODUCT_PATH (the product page), EMAIL and PASSWORD
// (the customer), ARTIFACTS (screenshot dir), CHROMIUM.
// Every request that fails (network error, or a status of 400 or more)
// is recorded; on stdout the last line is `shop.mjs: result {json}` with
// `failed` (those requests), `requests` (how many were made), `xcache`
// (the X-Cache values seen, by path) and `signedIn` (the signed-in page
// URLs). Exits non-zero, with screenshots, when a step does not work.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const need = (k) => { const v = process.env[k]; if (!v) { console.error(`${k} is not set`); process.exit(2); } return v; };
const gateway = need('GATEWAY_URL'), productPath = need('PRODUCT_PATH');
const email = need('EMAIL'), password = need('PASSWORD');
const artifacts = process.env.ARTIFACTS || 'target/browser-artifacts/shop';
mkdirSync(artifacts, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const step = (msg) => console.log(`shop.mjs: ${msg}`);
const pages = [];
const failed = [];
const xcache = {};
let requests = 0;
const shot = async (page, name) => { await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true }); };

// A client of its own (fresh profile) whose every request is watched.
async function client(name) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  pages.push([name, page]);
  page.on('request', () => { requests++; });
  page.on('requestfailed', (r) => failed.push(`${name} ${r.method()} ${r.url()}: ${r.failure()?.errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) failed.push(`${name} ${r.request().method()} ${r.url()}: ${r.status()}`);
    const x = r.headers()['x-cache'];
    if (x) { const path = new URL(r.url()).pathname; (xcache[path] ||= []).push(x); }
  });
  page.on('pageerror', (e) => failed.push(`${name} script error: ${e.message}`));
  return page;
}

// Opens `path` and waits until every asset of the page has loaded.
async function open(page, path) {
  const resp = await page.goto(`${gateway}${path}`, { waitUntil: 'load' });
  await page.waitForLoadState('networkidle');
  if (!resp || resp.status() >= 400) throw new Error(`${path}: ${resp && resp.status()}`);
  return resp;
}

const signedIn = [];
try {
  const a = await client('customer');
  await open(a, '/');
  // The shop's own stylesheet and scripts ran: Bootstrap styles the page
  // and Oscar's jQuery code is there.
  if (!(await a.evaluate(() => typeof window.jQuery === 'function' && typeof window.oscar === 'object'))) {
    throw new Error('the shop\'s scripts did not load');
  }
  const font = await a.evaluate(() => getComputedStyle(document.body).fontFamily);
  if (!/apple-system|Segoe|Roboto|Helvetica/i.test(font)) throw new Error(`the shop's stylesheet did not apply (font ${font})`);
  step(`home ${a.url()} styled and scripted`);
  await shot(a, '1-home');

  await open(a, productPath);
  await a.locator('h1', { hasText: 'Flash sneaker' }).waitFor();
  step('product page shown');
  await shot(a, '2-product');

  await open(a, '/accounts/login/');
  await a.locator('#id_login-username').fill(email);
  await a.locator('#id_login-password').fill(password);
  await Promise.all([a.waitForNavigation(), a.locator('button[name=login_submit]').click()]);
  await a.locator('#logout_link').waitFor({ timeout: 10_000 });
  step(`signed in, at ${a.url()}`);
  await shot(a, '3-signed-in');

  await open(a, productPath);
  await a.locator('#logout_link').waitFor();
  await Promise.all([a.waitForNavigation(), a.locator('#add_to_basket_form button[type=submit]').click()]);
  await a.waitForLoadState('networkidle');
  await a.locator('.alert', { hasText: 'has been added to your basket' }).first().waitFor({ timeout: 10_000 });
  step('added to the basket');
  signedIn.push(productPath);

  await open(a, '/basket/');
  await a.locator('#basket_formset a, .basket-items a', { hasText: 'Flash sneaker' }).first().waitFor({ timeout: 10_000 });
  const total = await a.locator('.basket-totals, #basket_totals').first().textContent();
  if (!/120\.00/.test(total)) throw new Error(`basket total without the sneaker: ${total}`);
  step('basket holds the sneaker');
  signedIn.push('/basket/');
  await shot(a, '4-basket');

  await open(a, '/accounts/profile/');
  await a.locator('body', { hasText: email }).waitFor();
  signedIn.push('/accounts/profile/');

  // Another client, without the customer's cookies, on the same URLs.
  const b = await client('stranger');
  for (const path of signedIn) {
    await b.goto(`${gateway}${path}`, { waitUntil: 'load' });
    await b.waitForLoadState('networkidle');
    const html = await b.content();
    if (html.includes('logout_link') || html.includes(email)) throw new Error(`${path} showed the stranger the customer's page`);
  }
  await open(b, '/basket/');
  if ((await b.content()).includes('Flash sneaker')) throw new Error('the stranger sees the customer\'s basket');
  step(`a stranger opening ${signedIn.join(' ')} is not signed in`);
  await shot(b, '5-stranger-basket');
} catch (e) {
  console.error(`shop.mjs: FAILED: ${e.stack || e}`);
  console.log(`shop.mjs: failed requests: ${JSON.stringify(failed, null, 1)}`);
  for (const [name, p] of pages) await shot(p, `failure-${name}`).catch(() => {});
  await browser.close();
  process.exit(1);
}
await browser.close();
console.log(`shop.mjs: result ${JSON.stringify({ failed, requests, xcache, signedIn })}`);
