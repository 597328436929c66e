// Web Worker of the sale page: solves a Flashgate proof-of-work challenge.
//
// Message in: {challenge, bits}. Message out: {challenge, header}, where
// header = "<challenge>.<nonce>" and SHA-256 of that ASCII string starts
// with at least `bits` zero bits (the value of the Flashgate-Pow header).
// Hashes with WebCrypto, a batch at a time, off the page's main thread.
'use strict';

const BATCH = 64;
const encoder = new TextEncoder();

function zeroBits(digest) {
  let bits = 0;
  for (const byte of new Uint8Array(digest)) {
    if (byte !== 0) return bits + Math.clz32(byte) - 24;
    bits += 8;
  }
  return bits;
}

self.onmessage = async (event) => {
  const { challenge, bits } = event.data;
  for (let start = 0; ; start += BATCH) {
    const headers = [];
    for (let n = start; n < start + BATCH; n++) headers.push(`${challenge}.${n}`);
    const digests = await Promise.all(headers.map((h) => crypto.subtle.digest('SHA-256', encoder.encode(h))));
    const hit = digests.findIndex((d) => zeroBits(d) >= bits);
    if (hit >= 0) {
      self.postMessage({ challenge, header: headers[hit] });
      return;
    }
  }
};
