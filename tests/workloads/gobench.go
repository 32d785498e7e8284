// Benchmark workload of `cargo xtask bench` (its `go` section): the cost of a call of a tiny
// Go function, and of a goroutine switch.
//
//	gobench calls N     calls tiny N times, prints ns_per_call and calls
//	gobench switches N  two goroutines on one P pass a token N times each way over unbuffered
//	                    channels, inside pingpong and peer (whose frames stay open across every
//	                    switch), prints ns_per_switch and switches
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

//go:noinline
func tiny(x int) int { return x + 1 }

//go:noinline
func peer(n int, in <-chan int, out chan<- int) {
	for i := 0; i < n; i++ {
		out <- <-in + 1
	}
}

//go:noinline
func pingpong(n int, in <-chan int, out chan<- int) int {
	token := 0
	for i := 0; i < n; i++ {
		out <- token
		token = <-in
	}
	return token
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gobench calls|switches N")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "gobench: N must be a positive number")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "calls":
		sink := 0
		start := time.Now()
		for i := 0; i < n; i++ {
			sink = tiny(sink)
		}
		elapsed := time.Since(start)
		fmt.Printf("ns_per_call=%.1f\ncalls=%d\nsink=%d\n",
			float64(elapsed.Nanoseconds())/float64(n), n, sink)
	case "switches":
		runtime.GOMAXPROCS(1)
		there, back := make(chan int), make(chan int)
		go peer(n, there, back)
		start := time.Now()
		token := pingpong(n, back, there)
		elapsed := time.Since(start)
		// Each round trip parks each goroutine once: two switches.
		fmt.Printf("ns_per_switch=%.1f\nswitches=%d\ntoken=%d\n",
			float64(elapsed.Nanoseconds())/float64(2*n), 2*n, token)
	default:
		fmt.Fprintln(os.Stderr, "usage: gobench calls|switches N")
		os.Exit(2)
	}
}
