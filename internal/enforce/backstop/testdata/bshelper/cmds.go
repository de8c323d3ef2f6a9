package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// cmdLoop runs commands read from stdin, one a line, each answered with a
// line on stdout, so a test can move the process between cgroups, reload
// the policy or exec between its system calls (membership_test.go):
//
//	loop N PATH          open and close PATH N times
//	open PATH            open PATH, read it (a directory: list it), close
//	move PROCS           write this process's pid to PROCS (cgroup.procs)
//	moveopen PROCS PATH  move, then open PATH at once: the next syscalls
//	spin PATH            answer "spinning", then open and close PATH until
//	                     the next line arrives (that line is the next command)
//	spawn CG OP ARGS...  run bshelper OP ARGS in cgroup CG (clone3
//	                     CLONE_INTO_CGROUP); answer how the child ended
//	exec PATH ARGS...    execve
//	quit
func cmdLoop() {
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next, ok := <-lines
	for ok {
		f := strings.Fields(next)
		if len(f) == 0 {
			next, ok = <-lines
			continue
		}
		arg := func(i int) string {
			if i < len(f) {
				return f[i]
			}
			return ""
		}
		var reply string
		var err error
		switch f[0] {
		case "loop":
			n, _ := strconv.Atoi(arg(1))
			for i := 0; i < n && err == nil; i++ {
				err = openPath(arg(2))
			}
			reply = "looped"
		case "open":
			err = openPath(arg(1))
			reply = "opened"
		case "move":
			err = movePid(arg(1))
			reply = "moved"
		case "moveopen":
			if err = movePid(arg(1)); err == nil {
				err = openPath(arg(2))
			}
			reply = "opened"
		case "spin":
			fmt.Println("spinning")
		spin:
			for err == nil {
				select {
				case next, ok = <-lines:
					break spin
				default:
					err = openPath(arg(1))
				}
			}
			if err != nil {
				fmt.Printf("err %v\n", err)
				next, ok = <-lines
			}
			continue
		case "spawn":
			reply, err = spawn(arg(1), f[2:])
		case "exec":
			err = syscall.Exec(arg(1), f[1:], nil)
		case "quit":
			os.Exit(0)
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		if err != nil {
			reply = "err " + err.Error()
		}
		fmt.Println(reply)
		next, ok = <-lines
	}
}

func openPath(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		_, err = unix.Getdents(fd, buf)
		return err
	}
	_, err = unix.Read(fd, buf)
	return err
}

func movePid(procs string) error {
	fd, err := unix.Open(procs, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, []byte(strconv.Itoa(os.Getpid())))
	unix.Close(fd)
	return err
}

// spawn runs this binary with args in cgroup cg, created by clone3 with
// CLONE_INTO_CGROUP.
func spawn(cg string, args []string) (string, error) {
	dir, err := os.Open(cg)
	if err != nil {
		return "", err
	}
	defer dir.Close()
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return "child killed", nil
		}
	}
	if err != nil {
		return "", err
	}
	return "child ok", nil
}
