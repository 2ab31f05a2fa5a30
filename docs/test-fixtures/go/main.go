// docs-test fixture: a Go block, run as the body of main.
package main

import (
	"errors"
	"fmt"
	"log"
	"os"

	"memprobe.dev/memprobe"
)

func main() {
	// docs-test: block
}
