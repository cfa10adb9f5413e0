// Java 17 UDP echo for the drop-in matrix: `java UdpEcho.java ADDR PORT COUNT`.
// Options set before bind (timeout, buffers, traffic class) must survive.
import java.net.*;

public class UdpEcho {
    public static void main(String[] a) throws Exception {
        DatagramSocket s = new DatagramSocket(null);
        s.setReuseAddress(true);
        s.setSoTimeout(10000);
        s.setReceiveBufferSize(1 << 20);
        s.setTrafficClass(0x10);
        s.bind(new InetSocketAddress(a[0], Integer.parseInt(a[1])));
        int n = Integer.parseInt(a[2]);
        System.out.println("ready timeout=" + s.getSoTimeout() + " tos=" + s.getTrafficClass());
        byte[] buf = new byte[65536];
        int got = 0;
        try {
            while (got < n) {
                DatagramPacket p = new DatagramPacket(buf, buf.length);
                s.receive(p);
                if (new String(p.getData(), 0, p.getLength()).equals("quit")) break;
                s.send(new DatagramPacket(p.getData(), p.getLength(), p.getSocketAddress()));
                got++;
            }
        } catch (SocketTimeoutException e) {
            System.out.println("timeout");
        }
        System.out.println("echoed " + got);
        // a receive with nothing coming: the timeout set before bind fires
        s.setSoTimeout(200);
        try {
            s.receive(new DatagramPacket(buf, buf.length));
            System.out.println("unexpected datagram");
        } catch (SocketTimeoutException e) {
            System.out.println("idle receive: timeout");
        }
        s.close();
    }
}
