/*
 * The only binary of the e2e test image, installed as /pause.
 *
 * One static binary plays every role the tests need so the image stays a
 * single tiny layer that any containerd or dockerd can import offline:
 *   (no args)      block as PID 1 until SIGTERM/SIGINT, then exit 0
 *   env            print the environment, one variable per line
 *   echo ARGS...   print ARGS joined by a space
 *   cat FILE       copy FILE to stdout
 *   sleep N        sleep N seconds
 *   exit N         exit with status N
 *   big N          write N bytes of 'x' to stdout
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int do_pause(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* PID 1 must reap orphans so exec'd processes don't linger as zombies. */
    signal(SIGCHLD, SIG_IGN);
    while (!stop_requested)
        pause();
    return 0;
}

static int do_env(void) {
    for (char **e = environ; *e != NULL; e++)
        printf("%s\n", *e);
    return 0;
}

static int do_echo(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        printf(i == 0 ? "%s" : " %s", argv[i]);
    printf("\n");
    return 0;
}

static int do_cat(const char *path) {
    char buf[65536];
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "pause cat: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return n < 0 ? 1 : 0;
        }
        if (write_all(1, buf, (size_t)n) < 0)
            return 1;
    }
}

static int do_big(long long n) {
    static char buf[65536];
    memset(buf, 'x', sizeof(buf));
    while (n > 0) {
        size_t chunk = n > (long long)sizeof(buf) ? sizeof(buf) : (size_t)n;
        if (write_all(1, buf, chunk) < 0)
            return 1;
        n -= (long long)chunk;
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: pause [env | echo ARGS... | cat FILE | sleep N | exit N | big N]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return do_pause();
    const char *cmd = argv[1];
    int rc;
    if (strcmp(cmd, "env") == 0)
        rc = do_env();
    else if (strcmp(cmd, "echo") == 0)
        rc = do_echo(argc - 2, argv + 2);
    else if (strcmp(cmd, "cat") == 0 && argc == 3)
        rc = do_cat(argv[2]);
    else if (strcmp(cmd, "sleep") == 0 && argc == 3) {
        unsigned int left = (unsigned int)strtoul(argv[2], NULL, 10);
        while (left > 0)
            left = sleep(left);
        rc = 0;
    } else if (strcmp(cmd, "exit") == 0 && argc == 3)
        rc = atoi(argv[2]);
    else if (strcmp(cmd, "big") == 0 && argc == 3)
        rc = do_big(strtoll(argv[2], NULL, 10));
    else
        rc = usage();
    fflush(stdout);
    return rc;
}
