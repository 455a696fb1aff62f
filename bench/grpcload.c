/* A minimal gRPC load client: one HTTP/2 connection over a unix socket, sequential calls of an
 * empty-request unary method for a number of seconds; prints "<ok> <failed>".
 *
 *     grpcload <socket> <method path> <seconds>
 *
 * Why C: a grpc-python client costs more CPU per call than the HAProxy data plane, so Python
 * clients on a 2-core machine measure themselves, not the proxy.  This one costs a few µs.
 * It sends literal HPACK headers and never decodes the answer's: a call is ok when a
 * non-empty message came back before the trailers, which a gRPC error never sends.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int fd;
static unsigned char in[1 << 20];
static size_t in_len;

static void die(const char *what) {
    fprintf(stderr, "grpcload: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void send_all(const unsigned char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) die("write");
        p += w;
        n -= (size_t)w;
    }
}

static size_t frame_header(unsigned char *b, size_t len, int type, int flags, uint32_t stream) {
    b[0] = (unsigned char)(len >> 16); b[1] = (unsigned char)(len >> 8); b[2] = (unsigned char)len;
    b[3] = (unsigned char)type; b[4] = (unsigned char)flags;
    b[5] = (unsigned char)(stream >> 24); b[6] = (unsigned char)(stream >> 16);
    b[7] = (unsigned char)(stream >> 8); b[8] = (unsigned char)stream;
    return 9;
}

static size_t literal(unsigned char *b, const char *s) {
    size_t n = strlen(s);  /* every string here is shorter than 127 bytes */
    b[0] = (unsigned char)n;
    memcpy(b + 1, s, n);
    return n + 1;
}

/* HEADERS + DATA(END_STREAM) of one call on ``stream``. */
static size_t request(unsigned char *b, const char *path, uint32_t stream) {
    unsigned char h[512];
    size_t n = 0;
    h[n++] = 0x83;                         /* :method POST (static 3) */
    h[n++] = 0x86;                         /* :scheme http (static 6) */
    h[n++] = 0x04; n += literal(h + n, path);        /* :path, name static 4 */
    h[n++] = 0x01; n += literal(h + n, "localhost"); /* :authority, name static 1 */
    h[n++] = 0x0f; h[n++] = 0x10; n += literal(h + n, "application/grpc"); /* content-type, static 31 */
    h[n++] = 0x00; n += literal(h + n, "te"); n += literal(h + n, "trailers");
    size_t o = frame_header(b, n, 1, 0x4, stream);
    memcpy(b + o, h, n);
    o += n;
    o += frame_header(b + o, 5, 0, 0x1, stream);
    memset(b + o, 0, 5);                   /* gRPC message prefix: uncompressed, 0 bytes */
    return o + 5;
}

/* Reads frames until ``stream`` ends; 1 when it carried a message, 0 when it failed. */
static int await_answer(uint32_t stream) {
    size_t data = 0;
    for (;;) {
        while (in_len >= 9) {
            size_t len = ((size_t)in[0] << 16) | ((size_t)in[1] << 8) | in[2];
            if (len + 9 > sizeof in) { errno = EMSGSIZE; die("frame"); }
            if (in_len < len + 9) break;
            int type = in[3], flags = in[4];
            uint32_t sid = (((uint32_t)in[5] & 0x7f) << 24) | ((uint32_t)in[6] << 16) | ((uint32_t)in[7] << 8) | in[8];
            int done = -1;
            unsigned char reply[32];
            if (type == 4 && !(flags & 1)) {           /* SETTINGS: acknowledge */
                send_all(reply, frame_header(reply, 0, 4, 1, 0));
            } else if (type == 6 && !(flags & 1) && len == 8) {  /* PING: answer */
                size_t o = frame_header(reply, 8, 6, 1, 0);
                memcpy(reply + o, in + 9, 8);
                send_all(reply, o + 8);
            } else if (type == 7) {                    /* GOAWAY */
                fprintf(stderr, "grpcload: server sent GOAWAY\n");
                exit(3);
            } else if (sid == stream && type == 0) {
                data += len;
                if (flags & 1) done = data > 5;
            } else if (sid == stream && type == 1 && (flags & 1)) {
                done = data > 5;
            } else if (sid == stream && type == 3) {   /* RST_STREAM */
                done = 0;
            }
            memmove(in, in + 9 + len, in_len - 9 - len);
            in_len -= 9 + len;
            if (done >= 0) return done;
        }
        ssize_t r = read(fd, in + in_len, sizeof in - in_len);
        if (r <= 0) { errno = r ? errno : ECONNRESET; die("read"); }
        in_len += (size_t)r;
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: grpcload <socket> <method path> <seconds>\n");
        return 2;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof addr.sun_path || strlen(argv[2]) > 120) {
        fprintf(stderr, "grpcload: socket path or method path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, argv[1]);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");

    unsigned char b[1024];
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    size_t o = sizeof preface - 1;
    memcpy(b, preface, o);
    o += frame_header(b + o, 0, 4, 0, 0);                 /* SETTINGS, defaults */
    o += frame_header(b + o, 4, 8, 0, 0);                 /* WINDOW_UPDATE: the connection never blocks */
    uint32_t inc = 0x7fffffff - 65535;
    b[o++] = (unsigned char)(inc >> 24); b[o++] = (unsigned char)(inc >> 16);
    b[o++] = (unsigned char)(inc >> 8); b[o++] = (unsigned char)inc;
    send_all(b, o);

    double end = now() + atof(argv[3]);
    long ok = 0, failed = 0;
    for (uint32_t stream = 1; now() < end && stream < 0x7ffffff0; stream += 2) {
        send_all(b, request(b, argv[2], stream));
        if (await_answer(stream)) ok++; else failed++;
    }
    printf("%ld %ld\n", ok, failed);
    return 0;
}
