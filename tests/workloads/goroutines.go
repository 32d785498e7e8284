// The Go workload of tests/tests/go.rs: goroutines on two Ps calling functions that make
// known numbers of getppid (synthetic `slots`) and getpgid (`topdown-retiring`) system calls,
// across goroutine switches, stack growth, recovered panics and runtime.Goexit.
//
// Usage: goroutines N. Goroutine i does, by i % 6 (k = 1 + i%5 getppid calls):
//
//	0: work(k, yield)  yielding (runtime.Gosched) after each call, so its frame stays open
//	                   while other goroutines run on its thread
//	1: outer(k)        one getpgid, then 200 levels of unprobed recursion whose frames grow
//	                   and copy the stack, work(k) at the bottom
//	2: guarded(k)      calls thrower(k), which runs work(k) and panics; guarded's deferred
//	                   function recovers
//	3: waiter(m)       m = 1 + i%3 getpgid calls, then parks on a channel until every other
//	                   goroutine has finished
//	4: quitter(k)      work(k), then runtime.Goexit
//	5: rec(n, k)       n = 20 + i%10: probed recursion, one getpgid and 1 KiB of frame per
//	                   level (its prologue grows the stack while its own frames are open),
//	                   yielding work(k) at the bottom
//
// It prints what it did, the same however it is traced.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

var ppids, pgids, calls int64

func getppid() {
	syscall.Syscall(syscall.SYS_GETPPID, 0, 0, 0)
	atomic.AddInt64(&ppids, 1)
}

func getpgid() {
	syscall.Syscall(syscall.SYS_GETPGID, 0, 0, 0)
	atomic.AddInt64(&pgids, 1)
}

//go:noinline
func touch(pad []byte, at int) byte {
	pad[at%len(pad)]++
	return pad[(at+1)%len(pad)]
}

//go:noinline
func work(k int, yield bool) {
	atomic.AddInt64(&calls, 1)
	for i := 0; i < k; i++ {
		getppid()
		if yield {
			runtime.Gosched()
		}
	}
}

//go:noinline
func deep(level int, k int) int {
	var pad [512]byte
	if level == 0 {
		work(k, false)
		return int(touch(pad[:], level))
	}
	return deep(level-1, k) + int(touch(pad[:], level))
}

//go:noinline
func outer(k int) int {
	getpgid()
	return deep(200, k)
}

//go:noinline
func thrower(k int) {
	work(k, false)
	panic("thrown")
}

//go:noinline
func guarded(k int) (recovered bool) {
	defer func() {
		recovered = recover() != nil
	}()
	thrower(k)
	return false
}

//go:noinline
func waiter(m int, release <-chan struct{}) {
	for i := 0; i < m; i++ {
		getpgid()
	}
	<-release
}

//go:noinline
func quitter(k int) {
	work(k, false)
	runtime.Goexit()
}

//go:noinline
func rec(n int, k int) int {
	var pad [1024]byte
	getpgid()
	if n > 0 {
		return rec(n-1, k) + int(touch(pad[:], n))
	}
	work(k, true)
	return int(touch(pad[:], n))
}

func main() {
	runtime.GOMAXPROCS(2)
	n := 1000
	if len(os.Args) > 1 {
		parsed, err := strconv.Atoi(os.Args[1])
		if err != nil || parsed < 0 {
			fmt.Fprintln(os.Stderr, "usage: goroutines N")
			os.Exit(2)
		}
		n = parsed
	}
	release := make(chan struct{})
	var others, waiters sync.WaitGroup
	var recovered int64
	for i := 0; i < n; i++ {
		k := 1 + i%5
		group := &others
		if i%6 == 3 {
			group = &waiters
		}
		group.Add(1)
		go func(i int) {
			defer group.Done()
			switch i % 6 {
			case 0:
				work(k, true)
			case 1:
				outer(k)
			case 2:
				if guarded(k) {
					atomic.AddInt64(&recovered, 1)
				}
			case 3:
				waiter(1+i%3, release)
			case 4:
				quitter(k)
			case 5:
				rec(20+i%10, k)
			}
		}(i)
	}
	others.Wait()
	close(release)
	waiters.Wait()
	fmt.Printf("goroutines %d work %d getppid %d getpgid %d recovered %d\n",
		n, calls, ppids, pgids, recovered)
}
