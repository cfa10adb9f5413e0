// Node.js 20 dgram echo for the drop-in matrix: `node udp_echo.js ADDR PORT COUNT`.
const dgram = require('dgram');
const [addr, port, count] = [process.argv[2], +process.argv[3], +process.argv[4]];
const s = dgram.createSocket({ type: 'udp4', reuseAddr: true });
let got = 0;
const idle = setTimeout(() => { console.log('timeout'); done(); }, 10000);
function done() { console.log(`echoed ${got}`); s.close(); clearTimeout(idle); }
s.on('message', (msg, rinfo) => {
  if (msg.toString() === 'quit') return done();
  s.send(msg, rinfo.port, rinfo.address, () => { if (++got === count) done(); });
});
s.bind(port, addr, () => {
  s.setRecvBufferSize(1 << 20);
  console.log(`ready rcvbuf>=${s.getRecvBufferSize() >= (1 << 20)}`);
});
