// Sale page: the sale's state and remaining stock (polled from the gateway's
// micro-cache), a countdown synced to the server's clock, and a buy button.
//
// The buyer's token comes, in order, from: the shop's token endpoint named in
// <meta name="fg-token-url"> (if any), the `fg_token` cookie set by the shop,
// `?token=` in the address (demos and tests; removed from the address bar),
// or the token field. See docs/PAGES.md.
//
// The product shown beside the sale (photo, price, description) comes from
// `{prefix}/static/products/{sale id}.json` when that file exists (see
// docs/PAGES.md); without it the page shows the sale's name and stock only.
//
// When the gateway asks a proof of work of buys, the page fetches a
// challenge as soon as it has a token (GET {prefix}/api/sales/{id}/challenge) and
// solves it in a Web Worker ({prefix}/static/pow.js) while the countdown runs, so the
// click sends `Flashgate-Pow` at once. A 428 (challenge expired, or a harder
// one asked) is solved and the buy re-sent, up to three times.
'use strict';

// The gateway's paths live under gateway.path_prefix (written into the page's
// <meta name="fg-prefix"> by the gateway); the sale id is the page path's
// last segment, wherever the page is mounted ({prefix}/sales/{id}, /drops/{id}).
const PREFIX = document.querySelector('meta[name="fg-prefix"]')?.content || '';
const API = `${PREFIX}/api`;
const STATIC = `${PREFIX}/static`;
const saleId = decodeURIComponent(location.pathname.split('/').filter(Boolean).pop() || '');
const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const STATE_TEXT = { upcoming: 'Starts soon', open: 'On sale now', sold_out: 'Sold out', ended: 'Sale ended', paused: 'Paused' };

let sale = null;          // last state read from the gateway
let offsetMs = 0;         // server clock minus this clock
let bestRttMs = Infinity; // the clock offset is taken from the fastest read
let busy = false;         // a buy is in flight or being polled
let done = false;         // this buyer has an order (or can never get one)
let retryAt = 0;          // server-clock ms before which buying waits (Retry-After)
let pollTimer = 0;
let powOff = false;       // the gateway asks no proof of work (its challenge endpoint said 404)
let pow = null;           // {challenge, expiresAt, solved: Promise<header>} of the next buy
const POW_MARGIN_MS = 30_000; // a challenge this close to expiry is replaced

const serverNow = () => Date.now() + offsetMs;

function cookie(name) {
  const hit = document.cookie.split('; ').find((c) => c.startsWith(name + '='));
  return hit ? decodeURIComponent(hit.slice(name.length + 1)) : '';
}

async function initToken() {
  const url = document.querySelector('meta[name="fg-token-url"]')?.content;
  let token = '';
  if (url) {
    try {
      const r = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
      if (r.ok) token = (await r.json()).token || '';
    } catch (_) { /* fall back to the cookie and the field */ }
  }
  token = token || cookie('fg_token');
  const params = new URLSearchParams(location.search);
  if (!token && params.has('token')) {
    token = params.get('token');
    params.delete('token');
    const q = params.toString();
    history.replaceState(null, '', location.pathname + (q ? `?${q}` : '') + location.hash);
  }
  if (token) {
    $('token').value = token;
    $('token-field').hidden = true;
  }
}

const token = () => $('token').value.trim();

function say(text, kind = '') {
  $('result').textContent = text;
  $('result').dataset.kind = kind;
}

function setState(state) {
  const el = $('state');
  if (el.dataset.state !== state) {
    el.dataset.state = state;
    el.textContent = STATE_TEXT[state] || state;
  }
}

function render() {
  if (!sale) return;
  const now = serverNow();
  const starts = Date.parse(sale.starts_at), ends = Date.parse(sale.ends_at);
  let state = sale.state;
  // The clock is synced: flip to open at the start without waiting for a poll.
  if (state === 'upcoming' && now >= starts) state = sale.remaining > 0 ? 'open' : 'sold_out';
  if (now >= ends) state = 'ended';
  setState(state);

  const cd = $('countdown');
  const until = state === 'upcoming' ? ['Starts', starts] : state === 'open' && Number.isFinite(ends) ? ['Ends', ends] : null;
  if (until) {
    const left = Math.max(0, Math.ceil((until[1] - now) / 1000));
    const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
    const pad = (n) => String(n).padStart(2, '0');
    cd.textContent = `${until[0]} in ${h ? `${h}:` : ''}${pad(m)}:${pad(s)}`;
    cd.setAttribute('aria-label', `${until[0]} in ${left} seconds`);
    cd.hidden = false;
  } else {
    cd.hidden = true;
  }

  $('name').textContent = sale.name;
  document.title = `${sale.name}: flash sale`;
  $('remaining').textContent = sale.remaining;
  $('stock').textContent = sale.stock;
  $('stock-meter').max = Math.max(1, sale.stock);
  $('stock-meter').value = sale.remaining;

  const waiting = now < retryAt;
  $('buy').disabled = busy || done || waiting || state !== 'open';
  if (waiting) {
    say(`Busy right now: try again in ${Math.ceil((retryAt - now) / 1000)} s`, 'wait');
  } else if (retryAt) {
    retryAt = 0;
    say('');
  }
  if (!busy && !done && (state === 'sold_out' || state === 'ended') && !$('result').textContent) {
    say(state === 'sold_out' ? 'Sold out: every item has been claimed.' : 'This sale has ended.', 'bad');
  }
}

// Solves `challenge` (asking `bits`) in a worker; resolves to the header
// value, or rejects once the challenge has expired (`expiresAt`, ms) or a
// newer one replaced it (`cancel()`): no worker outlives its challenge.
function solve(challenge, bits, expiresAt) {
  let cancel = () => {};
  const solved = new Promise((resolve, reject) => {
    const worker = new Worker(`${STATIC}/pow.js`);
    const timer = setTimeout(() => cancel(), Math.max(0, (expiresAt || Infinity) - Date.now()));
    cancel = () => { clearTimeout(timer); worker.terminate(); reject(new Error('challenge expired or replaced')); };
    worker.onmessage = (e) => { clearTimeout(timer); worker.terminate(); resolve(e.data.header); };
    worker.onerror = (e) => { clearTimeout(timer); worker.terminate(); reject(e); };
    worker.postMessage({ challenge, bits });
  });
  solved.cancel = () => cancel();
  return solved;
}

// Takes a challenge (a 428 body or the challenge endpoint's answer) as the
// next buy's; the worker of the one it replaces stops.
function adopt(c) {
  if (pow) pow.solved.cancel();
  const expiresAt = Date.parse(c.expires_at);
  const solved = solve(c.challenge, c.difficulty_bits, expiresAt);
  solved.catch(() => { if (pow && pow.solved === solved) pow = null; });
  pow = { challenge: c.challenge, expiresAt, solved };
}

// Fetches and starts solving a challenge ahead of the click, unless one is
// ready and fresh, the gateway asks none, or there is nothing to buy.
let powFetching = false;
async function preparePow() {
  const state = sale && sale.state;
  if (powOff || powFetching || done || !token() || (state !== 'upcoming' && state !== 'open')) return;
  if (pow && pow.expiresAt - serverNow() > POW_MARGIN_MS) return;
  powFetching = true;
  try {
    const r = await fetch(`${API}/sales/${encodeURIComponent(saleId)}/challenge`, {
      headers: { Authorization: `Bearer ${token()}` }, cache: 'no-store',
    });
    if (r.status === 404) powOff = true;
    else if (r.ok) adopt(await r.json());
  } catch (_) { /* tried again at the next poll, or at the click */ } finally {
    powFetching = false;
  }
}

async function refresh() {
  clearTimeout(pollTimer);
  let next = POLL_MS;
  try {
    const t0 = Date.now();
    const r = await fetch(`${API}/sales/${encodeURIComponent(saleId)}`, { cache: 'no-store' });
    const t1 = Date.now();
    if (r.ok) {
      sale = await r.json();
      // Half the round trip is the best guess of when the server read its clock.
      if (t1 - t0 <= bestRttMs) {
        bestRttMs = t1 - t0;
        offsetMs = Date.parse(sale.server_time) - (t0 + t1) / 2;
      }
    } else if (r.status === 404) {
      setState('unknown');
      $('state').textContent = 'No such sale';
    }
    const wait = Number(r.headers.get('Retry-After'));
    if (wait > 0) next = wait * 1000;
  } catch (_) {
    next = 3 * POLL_MS;
  }
  render();
  preparePow();
  if (!document.hidden) pollTimer = setTimeout(refresh, next);
}

async function buy(event) {
  event.preventDefault();
  if (!token()) {
    say('Enter your buyer token first.', 'bad');
    $('token').focus();
    return;
  }
  busy = true;
  render();
  say('Sending your order…');
  // One key per click: a retry after a network error reuses it, so the
  // gateway answers it with the first outcome instead of buying twice.
  // The same solution goes with every re-send of this key: the gateway
  // lets a re-send of the same buy through with it.
  const key = crypto.randomUUID();
  let r, body, solution = '';
  if (!powOff && !pow) await preparePow();
  if (pow) {
    const ready = pow;
    pow = null; // used by this click; the next one gets a fresh challenge
    solution = await ready.solved.catch(() => '');
  }
  for (let attempt = 0, challenges = 0; ; attempt++) {
    try {
      // X-Flashgate-CSRF: a header a cross-site form cannot send, so a buy
      // signed in by the shop's cookie (auth.cookie) passes the gateway's
      // CSRF check.
      const headers = { 'Idempotency-Key': key, 'Content-Type': 'application/json', 'X-Flashgate-CSRF': '1' };
      if (token()) headers.Authorization = `Bearer ${token()}`;
      if (solution) headers['Flashgate-Pow'] = solution;
      r = await fetch(`${API}/sales/${encodeURIComponent(saleId)}/buy`, { method: 'POST', headers, body: '{}' });
      body = await r.json().catch(() => ({}));
      if (r.status === 428 && body.challenge && challenges++ < 3) {
        say('Preparing your order…');
        solution = await solve(body.challenge, body.difficulty_bits, Date.parse(body.expires_at));
        attempt = -1;
        continue;
      }
      break;
    } catch (_) {
      if (attempt >= 2) { busy = false; say('Network problem: please try again.', 'bad'); render(); return; }
      await new Promise((ok) => setTimeout(ok, 500 * (attempt + 1)));
    }
  }
  const retryAfter = Number(r.headers.get('Retry-After'));
  if ((r.status === 201 || r.status === 202) && isWebUrl(body.checkout_url)) {
    // The sale hands winners to the shop's checkout (docs/CHECKOUT.md).
    done = true;
    say('Reserved! Taking you to checkout…', 'ok');
    render();
    location.assign(body.checkout_url);
    return;
  }
  if (r.status === 201) {
    done = true;
    say(`Confirmed! Your order: ${body.order_id}`, 'ok');
  } else if (r.status === 202) {
    say('Queued: your item is reserved, confirming your order…');
    busy = true;
    return pollReservation(body.reservation_id);
  } else if (body.code === 'sold_out') {
    done = true;
    say('Sold out: every item has been claimed.', 'bad');
  } else if (body.code === 'limit_reached') {
    done = true;
    say('You already have the most this sale allows.', 'bad');
  } else if (body.code === 'ended') {
    done = true;
    say('This sale has ended.', 'bad');
  } else if (r.status === 401) {
    say('Please sign in again: your buyer token is missing or expired.', 'bad');
    $('token-field').hidden = false;
  } else if (retryAfter > 0) {
    retryAt = serverNow() + retryAfter * 1000;
  } else {
    say(body.message || `Something went wrong (${r.status}).`, 'bad');
  }
  busy = false;
  render();
  refresh();
}

// Only an http(s) URL is followed: never a `javascript:` one.
function isWebUrl(url) {
  if (typeof url !== 'string') return false;
  try {
    const u = new URL(url);
    return u.protocol === 'https:' || u.protocol === 'http:';
  } catch (_) {
    return false;
  }
}

async function pollReservation(rid) {
  try {
    const r = await fetch(`${API}/reservations/${encodeURIComponent(rid)}`, { headers: { Authorization: `Bearer ${token()}` }, cache: 'no-store' });
    const body = await r.json().catch(() => ({}));
    if (body.status === 'confirmed' || body.status === 'paid') {
      busy = false; done = true;
      say(`Confirmed! Your order: ${body.order_id}`, 'ok');
      render();
      return;
    }
    if (body.status === 'cancelled' || body.status === 'expired') {
      busy = false; done = true;
      say('Your reservation was cancelled.', 'bad');
      render();
      return;
    }
  } catch (_) { /* keep polling */ }
  setTimeout(() => pollReservation(rid), 1000);
}

// The product's photo, price and description, from a static file the shop
// publishes per sale. Text goes in as text; only a local image is shown.
async function loadProduct() {
  if (!saleId) return;
  let p;
  try {
    const r = await fetch(`${STATIC}/products/${encodeURIComponent(saleId)}.json`);
    if (!r.ok) return;
    p = await r.json();
  } catch (_) { return; }
  // A file name under {prefix}/static/products/ (nothing from elsewhere).
  if (typeof p.image === 'string' && /^[A-Za-z0-9._-]+$/.test(p.image) && !p.image.startsWith('.')) {
    $('product-image').src = `${STATIC}/products/${p.image}`;
    $('product-image').alt = typeof p.image_alt === 'string' ? p.image_alt : '';
    $('product-figure').hidden = false;
  }
  if (typeof p.price === 'string' && p.price) {
    $('price').textContent = p.price;
    if (typeof p.was_price === 'string' && p.was_price) {
      $('was-price').textContent = p.was_price;
      $('was-price').setAttribute('aria-label', `was ${p.was_price}`);
      $('was-price').hidden = false;
    }
    $('price-row').hidden = false;
  }
  if (typeof p.description === 'string' && p.description) {
    $('description').textContent = p.description;
    $('description').hidden = false;
  }
}

document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });
$('buy-form').addEventListener('submit', buy);
loadProduct();
initToken().finally(refresh);
setInterval(render, 250);
