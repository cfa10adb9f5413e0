//! The one table of interposed functions: name and exact glibc signature.
//! `exports` turns it into the C entry points, `real` into the pointers to
//! libc's own functions. Type names are resolved where the table is
//! expanded (both modules import the same `libc` names).

/// The interposed functions with their exact glibc signatures. `$cb` is
/// the macro that turns the list into code (`export_fns` here, `real_fns`
/// in [`crate::real`]).
macro_rules! interposed {
    ($cb:ident) => {
        $cb! {
            socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
            accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
            setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
            shutdown(fd: c_int, how: c_int) -> c_int;
            close(fd: c_int) -> c_int;
            dup(fd: c_int) -> c_int;
            dup2(old: c_int, new: c_int) -> c_int;
            dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
            recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
            recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
            recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
            recvmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int, tmo: *mut timespec) -> c_int;
            read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
            readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
            __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
            __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
            __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
            poll(fds: *mut pollfd, n: nfds_t, tmo: c_int) -> c_int;
            __poll_chk(fds: *mut pollfd, n: nfds_t, tmo: c_int, fdslen: size_t) -> c_int;
            ppoll(fds: *mut pollfd, n: nfds_t, tmo: *const timespec, mask: *const sigset_t) -> c_int;
            __ppoll_chk(fds: *mut pollfd, n: nfds_t, tmo: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
            select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
            pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tmo: *const timespec, mask: *const sigset_t) -> c_int;
            epoll_create(size: c_int) -> c_int;
            epoll_create1(flags: c_int) -> c_int;
            epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
            epoll_wait(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: c_int) -> c_int;
            epoll_pwait(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: c_int, mask: *const sigset_t) -> c_int;
            epoll_pwait2(ep: c_int, evs: *mut epoll_event, max: c_int, tmo: *const timespec, mask: *const sigset_t) -> c_int;
            bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
            listen(fd: c_int, backlog: c_int) -> c_int;
            getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
            connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
            sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
            send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
            sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
            sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
            sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t;
            sendfile64(out: c_int, inp: c_int, off: *mut off64_t, count: size_t) -> ssize_t;
            splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: size_t, flags: c_uint) -> ssize_t;
            write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
            writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
            sigaction(sig: c_int, act: *const libc::sigaction, oact: *mut libc::sigaction) -> c_int;
            signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
            munmap(addr: *mut c_void, len: size_t) -> c_int;
            mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int;
        }
    };
}
pub(crate) use interposed;
