// UDP echo on the JVM: NIO DatagramChannel (non-blocking) + Selector (epoll).
//
//   java Echo.java server ADDR PORT          (or javac -d DIR Echo.java; java -cp DIR Echo ...)
//   java Echo.java client ADDR PORT N INFLIGHT SIZE WARMUP
//
// Same contract as echo_mt.c: the client sends WARMUP + N datagrams with
// INFLIGHT outstanding, checks every reply (length, sequence seen once, every
// byte), prints "ok N datagrams in X ms" and one JSON line; exit 1 on a bad or
// duplicate datagram, 2 when nothing came back for 5 s.

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardProtocolFamily;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.DatagramChannel;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;

public class Echo {
    static void fill(ByteBuffer b, long seq, int size) {
        b.clear();
        b.putLong(seq);
        for (int i = 8; i < size; i++) b.put((byte) (seq * 7 + i * 13));
        b.flip();
    }

    static void fail(int code, String msg) {
        System.err.println("Echo.java: " + msg);
        System.exit(code);
    }

    public static void main(String[] a) throws Exception {
        if (a.length < 3 || !(a[0].equals("server") || (a[0].equals("client") && a.length >= 7))) {
            fail(1, "usage: Echo server ADDR PORT | client ADDR PORT N INFLIGHT SIZE WARMUP");
        }
        InetSocketAddress where = new InetSocketAddress(a[1], Integer.parseInt(a[2]));
        DatagramChannel ch = DatagramChannel.open(StandardProtocolFamily.INET);
        ch.configureBlocking(false);
        Selector sel = Selector.open();
        ByteBuffer buf = ByteBuffer.allocateDirect(65536).order(ByteOrder.LITTLE_ENDIAN);
        if (a[0].equals("server")) {
            ch.bind(where);
            ch.register(sel, SelectionKey.OP_READ);
            System.out.println("ready");
            System.out.flush();
            for (;;) {
                sel.select();
                sel.selectedKeys().clear();
                for (;;) {
                    buf.clear();
                    SocketAddress src = ch.receive(buf);
                    if (src == null) break;
                    buf.flip();
                    ch.send(buf, src);
                }
            }
        }
        int n = Integer.parseInt(a[3]), inflight = Integer.parseInt(a[4]);
        int size = Integer.parseInt(a[5]), warmup = Integer.parseInt(a[6]);
        int total = warmup + n;
        boolean[] seen = new boolean[total];
        ByteBuffer out = ByteBuffer.allocateDirect(size).order(ByteOrder.LITTLE_ENDIAN);
        ch.connect(where);
        ch.register(sel, SelectionKey.OP_READ);
        int next = 0, received = 0;
        long t0 = 0, lastProgress = System.nanoTime();
        if (warmup == 0) t0 = System.nanoTime();
        for (; next < Math.min(inflight, total); next++) {
            fill(out, next, size);
            ch.write(out);
        }
        while (received < total) {
            if (sel.select(1000) == 0 && System.nanoTime() - lastProgress > 5_000_000_000L) {
                fail(2, "stalled: " + received + " of " + total + " replies (a datagram was lost)");
            }
            sel.selectedKeys().clear();
            for (;;) {
                buf.clear();
                int len = ch.read(buf);
                if (len <= 0) break;
                buf.flip();
                long seq = len == size ? buf.getLong(0) : -1;
                boolean good = seq >= 0 && seq < total;
                for (int i = 8; good && i < size; i++) good = buf.get(i) == (byte) (seq * 7 + i * 13);
                if (!good) fail(1, "bad datagram (" + len + " bytes)");
                if (seen[(int) seq]) fail(1, "duplicate datagram " + seq);
                seen[(int) seq] = true;
                received++;
                lastProgress = System.nanoTime();
                if (received == warmup) t0 = lastProgress;
                if (next < total) {
                    fill(out, next++, size);
                    ch.write(out);
                }
            }
        }
        double ms = (System.nanoTime() - t0) / 1e6;
        System.out.printf(java.util.Locale.ROOT, "ok %d datagrams in %.3f ms%n", n, ms);
        System.out.printf(java.util.Locale.ROOT,
                "{\"runtime\":\"jvm-nio\",\"n\":%d,\"inflight\":%d,\"size\":%d,\"warmup\":%d,\"received\":%d,\"elapsed_ms\":%.3f,\"ok\":true}%n",
                n, inflight, size, warmup, received, ms);
        System.out.flush();
        System.exit(0);
    }
}
