// Go functions as the compiler leaves them, for topdown's Go symbol tests
// (tests/tests/go.rs and topdown-user's symbols::go): a generic function instantiated for two
// shapes, a method of a generic type, a small function inlined into every caller (no code of
// its own), one inlined at its call but also kept as a function value (code of its own and
// an inlined copy), and a function that is never inlined. Each makes getppid calls
// (synthetic `slots`) so a probe can check its counts.
//
// Usage: gofuncs N: N rounds.
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func getppid() int {
	pid, _, _ := syscall.Syscall(syscall.SYS_GETPPID, 0, 0, 0)
	return int(pid)
}

type Number interface{ ~int | ~float64 }

//go:noinline
func Sum[T Number](xs []T) T {
	var total T
	for _, x := range xs {
		getppid()
		total += x
	}
	return total
}

type Stack[T any] struct{ items []T }

//go:noinline
func (s *Stack[T]) Push(item T) {
	getppid()
	s.items = append(s.items, item)
}

// Inlined into every caller: no code of its own.
func everywhereInlined(x int) int { return x*3 + 1 }

// Inlined where it is called directly (its call of plain is marked as inlined code there), and
// kept as code for the function value below.
func partlyInlined(x int) int { return plain(x) * 2 }

// A variable the compiler cannot see through, so calls through it need partlyInlined's code.
var asValue = partlyInlined

//go:noinline
func plain(x int) int {
	getppid()
	return x + 1
}

func main() {
	rounds := 1
	if len(os.Args) > 1 {
		parsed, err := strconv.Atoi(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "usage: gofuncs N")
			os.Exit(2)
		}
		rounds = parsed
	}
	total := 0
	for i := 0; i < rounds; i++ {
		total += Sum([]int{1, 2, 3})
		total += int(Sum([]float64{0.5, 1.5}))
		var stack Stack[string]
		stack.Push("a")
		total += len(stack.items)
		total += everywhereInlined(i) + partlyInlined(i) + asValue(i) + plain(i)
	}
	fmt.Println("gofuncs", rounds, total)
}
