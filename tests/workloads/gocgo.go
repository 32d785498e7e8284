// The cgo workload of tests/tests/go.rs: a Go function calling a C function (cgo) that makes
// getppid calls (synthetic `slots`). Usage: gocgo N: N calls of callC, each making 5.
package main

/*
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) long c_work(int n) {
	long made = 0;
	for (int i = 0; i < n; i++) {
		syscall(SYS_getppid);
		made++;
	}
	return made;
}
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
)

const perCall = 5

//go:noinline
func callC(n int) int64 { return int64(C.c_work(C.int(n))) }

func main() {
	rounds := 1
	if len(os.Args) > 1 {
		parsed, err := strconv.Atoi(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "usage: gocgo N")
			os.Exit(2)
		}
		rounds = parsed
	}
	made := int64(0)
	for i := 0; i < rounds; i++ {
		made += callC(perCall)
	}
	fmt.Println("gocgo", rounds, made/int64(rounds))
}
