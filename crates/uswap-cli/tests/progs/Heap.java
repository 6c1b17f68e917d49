// A Java program whose live heap is COUNT arrays of ~1 MiB (default 512), each filled with
// its own pattern, then every 8-byte word checked twice (the second pass after all were
// written, so that under a small budget most come back from swap). Exits 1 on a wrong
// value. Also a benchmark program: `java -Xmx2g Heap.java [COUNT]` under `uswap run`
// and under a memcg limit.
public class Heap {
    static long pat(long i, long j) { return (i + 1) * 0x9E3779B97F4A7C15L ^ j; }
    public static void main(String[] args) {
        int count = args.length > 0 ? Integer.parseInt(args[0]) : 512;
        long[][] arrs = new long[count][];
        for (int i = 0; i < count; i++) {
            // Just under 1 MiB with its header: one G1 region each, not a humongous pair.
            long[] a = new long[(1 << 17) - 8];
            for (int j = 0; j < a.length; j++) a[j] = pat(i, j);
            arrs[i] = a;
        }
        // Garbage as well, so that the collector works and moves things.
        long junk = 0;
        for (int k = 0; k < 64; k++) { long[] g = new long[1 << 17]; g[k] = k; junk += g[k]; }
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < count; i++)
                for (int j = 0; j < arrs[i].length; j++)
                    if (arrs[i][j] != pat(i, j)) {
                        System.out.println("BAD array " + i + " word " + j + " pass " + pass);
                        System.exit(1);
                    }
        System.out.println("heap ok " + count + " " + junk);
    }
}
