// UDP echo on Node.js `dgram` (libuv event loop: epoll, recvmmsg/sendmsg).
//
//   node echo.js server ADDR PORT
//   node echo.js client ADDR PORT N INFLIGHT SIZE WARMUP
//
// Same contract as echo_mt.c: the client sends WARMUP + N datagrams with
// INFLIGHT outstanding, checks every reply (length, sequence seen once,
// every byte), prints "ok N datagrams in X ms" and one JSON line; exit 1 on
// a bad or duplicate datagram, 2 when nothing came back for 5 s.
'use strict';
const dgram = require('dgram');

const [mode, addr, portS, ...rest] = process.argv.slice(2);
const port = Number(portS);

function fill(b, seq) {
  b.writeBigUInt64LE(BigInt(seq), 0);
  for (let i = 8; i < b.length; i++) b[i] = (seq * 7 + i * 13) & 0xff;
}

if (mode === 'server') {
  const s = dgram.createSocket('udp4');
  s.on('message', (msg, rinfo) => s.send(msg, rinfo.port, rinfo.address));
  s.on('error', (e) => { console.error('echo.js:', e.message); process.exit(1); });
  s.bind(port, addr, () => console.log('ready'));
} else if (mode === 'client' && rest.length >= 4) {
  const [n, inflight, size, warmup] = rest.map(Number);
  const total = warmup + n;
  const seen = new Uint8Array(total);
  let next = 0, received = 0, t0 = 0n, last = 0, quiet = 0;
  const s = dgram.createSocket('udp4');
  const send = () => { const b = Buffer.allocUnsafe(size); fill(b, next++); s.send(b); };
  s.on('error', (e) => { console.error('echo.js:', e.message); process.exit(1); });
  s.on('message', (msg) => {
    const seq = msg.length === size ? Number(msg.readBigUInt64LE(0)) : -1;
    let good = seq >= 0 && seq < total;
    for (let i = 8; good && i < size; i++) good = msg[i] === ((seq * 7 + i * 13) & 0xff);
    if (!good) { console.error(`echo.js: bad datagram (${msg.length} bytes)`); process.exit(1); }
    if (seen[seq]) { console.error(`echo.js: duplicate datagram ${seq}`); process.exit(1); }
    seen[seq] = 1;
    received++;
    if (received === warmup) t0 = process.hrtime.bigint();
    if (received === total) {
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      console.log(`ok ${n} datagrams in ${ms.toFixed(3)} ms`);
      console.log(JSON.stringify({ runtime: 'node', n, inflight, size, warmup, received, elapsed_ms: +ms.toFixed(3), ok: true }));
      process.exit(0);
    }
    if (next < total) send();
  });
  setInterval(() => {
    quiet = received === last ? quiet + 1 : 0;
    last = received;
    if (quiet >= 5) {
      console.error(`echo.js: stalled: ${received} of ${total} replies (a datagram was lost)`);
      process.exit(2);
    }
  }, 1000).unref();
  s.connect(port, addr, () => {
    if (warmup === 0) t0 = process.hrtime.bigint();
    for (let i = 0; i < Math.min(inflight, total); i++) send();
  });
} else {
  console.error('usage: node echo.js server ADDR PORT | client ADDR PORT N INFLIGHT SIZE WARMUP');
  process.exit(1);
}
