/* Private to the vm backend: the state of a workspace's VM (backends/vm.c boots and stops it)
 * and the relay that multiplexes commands over its one agent port (backends/vm_relay.c). */
#ifndef COWBOX_BACKENDS_VM_H
#define COWBOX_BACKENDS_VM_H

#include <pthread.h>
#include <stdint.h>

#include "cowbox/exec.h"
#include "cowbox/image.h"
#include "vm_stream.h"

struct cb_backend;

#define VM_MAX_RUNNING 256
#define VM_MAX_PORTS   64 /* host_url's ports per VM */

/* One command: a host process (the agent binary's --client mode, which the runner supervises)
 * whose connection to the relay carries the command's frames. */
struct vm_cmd {
	uint32_t id;	   /* 0: a free slot */
	struct cb_exec *h; /* the client's runner handle (set once exec has it) */
	char *run;	   /* the run frame's JSON, sent when the client connects; then NULL */
	int fd;		   /* the client's connection (-1: not yet, or closed) */
	int connected;	   /* it came (the run frame went to the guest) */
	int closed;	   /* the relay let go of it */
	int waited;	   /* vm_wait is done with the slot */
	int pending_kill;  /* a kill before the client connected */
	int killed;	   /* vm_kill was called */
	/* the guest's last frame */
	int exited, failed;
	int exit_code, term_signal, timed_out, output_limited, oom_killed;
	char msg[256];
	size_t stdin_unacked; /* stdin sent that the guest has not taken (<= CB_VM_WINDOW) */
};

/* A port host_url opened (or is opening) in the guest. */
#define VM_PORT_PENDING 1
#define VM_PORT_OPEN	2
struct vm_port {
	int port;  /* 0: a free slot */
	int state; /* VM_PORT_*, or -errno: the guest could not listen */
	int proxy; /* the egress proxy's: its connections go to proxy_sock, not the host's port */
	char err[200];
};

struct vm_state {
	char dir[4096];	       /* <workspace dir>/vm */
	char sockdir[64];      /* /tmp/cowbox-vm-XXXXXX (0700): agent.sock, run.sock */
	int kvm;	       /* -accel kvm (else TCG) */
	struct cb_exec *qemu;  /* qemu under the runner */
	pthread_t qemu_thread; /* waits for qemu; sets dead */
	int qemu_started;      /* qemu_thread runs */
	struct cb_exec_result qemu_res;
	int agent_fd;  /* the chardev of the agent's port (qemu's socket) */
	int listen_fd; /* the relay's socket, sockdir/run.sock */
	int wake[2];   /* wakes the relay thread: a new command, qemu's end, close */
	pthread_t relay_thread;
	int relay_started;
	pthread_mutex_t lock;  /* guards cmds, next_id, dead, stopping */
	pthread_mutex_t wlock; /* one writer of frames on agent_fd at a time */
	struct vm_cmd cmds[VM_MAX_RUNNING];
	uint32_t next_id;
	int dead;	  /* qemu ended or the port broke */
	int stopping;	  /* close began */
	char *agent;	  /* the agent binary (its --client mode runs each command) */
	char kernel[256]; /* what the agent's hello said */
	struct cb_backend_image_config image; /* the image's Env (commands start from it) */
	/* network all (backends/vm_net.c) */
	struct cb_exec *passt; /* passt under the runner; NULL: no NIC */
	char net_dir[64];      /* /tmp/cowbox-net-XXXXXX, nobody's: passt.sock */
	char net_sock[96];
	char net_append[256]; /* the kernel command line's cowbox.net= and cowbox.dns= */
	/* host_url (backends/vm_forward.c) */
	struct vm_port ports[VM_MAX_PORTS]; /* under lock */
	pthread_cond_t port_cond;	    /* a port's answer came */
	struct vm_streams streams;	    /* the relay thread's own */
	char proxy_sock[96];		    /* network public, allow: sockdir/proxy.sock */
};

/* Start the relay thread over s->agent_fd (connected, the hello read) and s->listen_fd. */
int vm_relay_start(struct vm_state *s);
/* Stop it and close every client connection (after qemu is gone or going). */
void vm_relay_stop(struct vm_state *s);
/* Reserve a slot for a command whose run frame is run (taken over, also on failure); *id. */
int vm_relay_reserve(struct vm_state *s, char *run, uint32_t *id);
/* The slot of id gets the client's handle h (NULL: exec failed, the slot is released). */
void vm_relay_started(struct vm_state *s, uint32_t id, struct cb_exec *h);
/* Send a kill frame for the command of h (or keep it for when its client connects). */
void vm_relay_kill(struct vm_state *s, struct cb_exec *h, int sig);
/* After the runner's wait of h: what the guest said in *out (a copy), the slot released.
 * Returns 0, or -ENOENT when h is no command of ours. */
int vm_relay_finish(struct vm_state *s, struct cb_exec *h, struct vm_cmd *out);
/* Write one frame to the agent (serialised with every other writer). */
int vm_relay_send(struct vm_state *s, uint32_t id, uint8_t type, const void *buf, size_t len);
/* Wake the relay thread (qemu ended). */
void vm_relay_wake(struct vm_state *s);

/* ---- host_url (backends/vm_forward.c) ---- */

/* Ready s's ports and streams (before the relay starts); free them (after it stopped). */
void vm_forward_init(struct vm_state *s);
void vm_forward_free(struct vm_state *s);
/* Have the guest listen on 127.0.0.1:port (once per port), waiting for its answer; from then
 * on its connections there reach the host's 127.0.0.1:port. Returns 0 or -errno (-EINVAL: a
 * port out of 1-65535, as ns says). */
int vm_forward_listen(struct vm_state *s, int port);
/* Network public or allow: start b's egress proxy on a socket of the sockdir's (0700) and
 * have the guest listen on 127.0.0.1:CB_NET_PROXY_PORT for it, the guest's one way out. */
int vm_forward_proxy(struct cb_backend *b, struct vm_state *s);
/* The relay thread's share of a frame from the guest (under s->lock): 1 if it was a stream's
 * or a listen answer, 0 if it is not ours. */
int vm_forward_frame(struct vm_state *s, uint32_t id, uint8_t type, const char *buf, size_t len);

/* ---- the guest agent's streams and stdin (backends/vm_agent_io.c, in the agent only) ---- */

/* Send a frame to the host (vm_agent.c: serialised with every other writer). */
int vm_agent_send(uint32_t id, uint8_t type, const void *buf, size_t len);
/* A listen or stream frame from the host, handed to the agent's stream thread (started on
 * the first); buf is taken over. The reader never blocks here. */
void vm_agent_io_frame(uint32_t id, uint8_t type, char *buf, size_t len);

struct vm_pump;
/* A thread that writes a command's stdin as the host's frames come and acknowledges each
 * write (credit), so the agent's reader never blocks on a full pipe; NULL: no thread. */
struct vm_pump *vm_pump_new(struct cb_exec *exec, uint32_t id);
/* Queue stdin bytes (within the host's credit) or its end; never blocks. */
void vm_pump_push(struct vm_pump *p, const void *buf, size_t len);
void vm_pump_end(struct vm_pump *p);
/* The command ended: the pump drops what is queued and goes. Returns 1 when the caller is to
 * free exec, 0 when the pump (still in a write) frees it as it ends. */
int vm_pump_release(struct vm_pump *p);

/* ---- boot material (backends/vm_boot.c) ---- */

/* The cache setup-vm fills: vm/vmlinuz, vm/modules.cpio.gz, rootfs-bookworm
 * ($COWBOX_IMAGE_CACHE, else /var/cache/cowbox). */
const char *vm_cache(void);
/* Whether to boot with KVM: COWBOX_VM_ACCEL=kvm|tcg decides; else /dev/kvm must open, make a
 * VM and a vCPU that takes the host's feature MSRs as qemu sets them, and no daemon since the
 * host's boot may have seen it fail to boot the guest. */
int vm_kvm_usable(void);

/* The host's TSC frequency in kHz, measured once per process against CLOCK_MONOTONIC (20 ms);
 * 2000000 where it cannot be measured. Under TCG the guest's TSC is the host's, so the guest
 * kernel must be told this rate, not a guess: told 2 GHz on a 2.45 GHz host, its clock ran
 * 22% fast and every timeout and grace inside the guest was that much short. */
long vm_host_tsc_khz(void);
/* Note, for the host's other daemons until it reboots, that KVM did not boot the guest. */
void vm_kvm_mark_broken(void);
/* The agent binary (malloc'd in *out): COWBOX_VM_AGENT, else beside the cowbox binary. */
int vm_find_agent(char **out);
/* Write the initrd at path: setup-vm's modules cpio, then agent as /init. */
int vm_make_initrd(const char *agent, const char *path);
/* SIGKILL the qemu a crashed daemon left in dir (its pid file; its command line names dir). */
void vm_kill_leftover(const char *dir);

/* ---- network all (backends/vm_net.c) ---- */

/* Start passt for s (network all): the host's address, prefix and gateway for the guest (in
 * s->net_append, for the agent), no port forwarded in, the host's loopback out of reach; it
 * listens on s->net_sock for qemu's one connection and ends with it. */
int vm_net_start(struct vm_state *s);
/* End passt if it still runs and remove its socket's directory (idempotent). */
void vm_net_stop(struct vm_state *s);

/* The agent binary's --client mode: connect to the relay at sock as command id, then stdin
 * to the command, its output to 1 and 2, its exit code as ours. */
int cb_vm_client_main(const char *sock, const char *id);

#endif
