// Node.js: COUNT Buffers of 1 MiB (default 1024), each filled with its own pattern, then
// every byte checked, twice (the second pass after all were written, so that under a
// small budget most come back from swap). Exits 1 on a wrong byte. Also a benchmark
// program: `node bufs.js [COUNT]` under `uswap run` and under a memcg limit.
'use strict';
const count = Number(process.argv[2] || 1024);
const MIB = 1 << 20;
const bufs = [];
function pattern(i) {
  const b = Buffer.allocUnsafe(MIB);
  for (let j = 0; j < MIB; j += 4) b.writeUInt32LE(((i * 2654435761) ^ j) >>> 0, j);
  return b;
}
for (let i = 0; i < count; i++) {
  const b = Buffer.alloc(MIB);
  pattern(i).copy(b);
  bufs.push(b);
}
for (let pass = 0; pass < 2; pass++) {
  for (let i = 0; i < count; i++) {
    const b = bufs[i];
    for (let j = 0; j < MIB; j += 4) {
      if (b.readUInt32LE(j) !== (((i * 2654435761) ^ j) >>> 0)) {
        console.log(`BAD buffer ${i} byte ${j} pass ${pass}`);
        process.exit(1);
      }
    }
  }
}
console.log(`buffers ok ${count}`);
