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
 *   burn CORES     keep CORES CPUs busy (fractions allowed: 0.5 = half a CPU) until SIGTERM/SIGINT
 *   hold MIB       allocate and touch MIB MiB of memory, keep it until SIGTERM/SIGINT
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
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

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One busy worker: spins `share` (0..1] of every 100 ms period, sleeps the rest. */
static void burn_worker(double share) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    const double period = 0.1;
    volatile unsigned long sink = 0;
    for (;;) {
        double start = now_seconds();
        while (now_seconds() - start < period * share)
            for (int i = 0; i < 10000; i++)
                sink += (unsigned long)i;
        if (share < 1.0) {
            struct timespec rest;
            double left = period * (1.0 - share);
            rest.tv_sec = 0;
            rest.tv_nsec = (long)(left * 1e9);
            nanosleep(&rest, NULL);
        }
    }
}

static int do_burn(const char *arg) {
    char *end;
    double cores = strtod(arg, &end);
    if (end == arg || *end != '\0' || !(cores > 0.0) || cores > 1024.0) {
        fprintf(stderr, "pause burn: %s: want a number of cores in (0, 1024]\n", arg);
        return 2;
    }
    catch_stop_signals();
    int workers = (int)cores + ((cores - (int)cores) > 0.0 ? 1 : 0);
    pid_t pids[1025];
    for (int w = 0; w < workers; w++) {
        double share = (w < (int)cores) ? 1.0 : cores - (int)cores;
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "pause burn: fork: %s\n", strerror(errno));
            for (int k = 0; k < w; k++)
                kill(pids[k], SIGKILL);
            return 1;
        }
        if (pid == 0)
            burn_worker(share);
        pids[w] = pid;
    }
    printf("burning %g cores\n", cores);
    fflush(stdout);
    while (!stop_requested)
        pause();
    for (int w = 0; w < workers; w++)
        kill(pids[w], SIGKILL);
    for (int w = 0; w < workers; w++)
        waitpid(pids[w], NULL, 0);
    return 0;
}

static int do_hold(const char *arg) {
    char *end;
    long long mib = strtoll(arg, &end, 10);
    if (end == arg || *end != '\0' || mib <= 0 || mib > 1048576) {
        fprintf(stderr, "pause hold: %s: want a number of MiB in [1, 1048576]\n", arg);
        return 2;
    }
    catch_stop_signals();
    size_t len = (size_t)mib << 20;
    unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        fprintf(stderr, "pause hold: mmap %lld MiB: %s\n", mib, strerror(errno));
        return 1;
    }
    /* Non-zero bytes on every page, so each page is really backed (no shared zero page). */
    long page = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)page)
        mem[off] = (unsigned char)(1 + off / (size_t)page % 255);
    printf("holding %lld MiB\n", mib);
    fflush(stdout);
    while (!stop_requested)
        pause();
    munmap(mem, len);
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: pause [env | echo ARGS... | cat FILE | sleep N | exit N | big N"
                    " | burn CORES | hold MIB]\n");
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
    else if (strcmp(cmd, "burn") == 0 && argc == 3)
        rc = do_burn(argv[2]);
    else if (strcmp(cmd, "hold") == 0 && argc == 3)
        rc = do_hold(argv[2]);
    else
        rc = usage();
    fflush(stdout);
    return rc;
}
