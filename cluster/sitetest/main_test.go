package sitetest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

var (
	binFlag    = flag.String("sitetest.bin", "", "peat binary to run (default: built from ../../cmd/peat)")
	execFlag   = flag.String("sitetest.exec", "", "runs the binary through this program (qemu-aarch64-static)")
	roundsFlag = flag.Int("sitetest.rounds", 20, "leader kill rounds")
	slowFlag   = flag.Int("sitetest.slow", 1, "multiplies every wait (an emulated binary is slower)")
	// connectFlag is the producers' CONNECT timeout, the one the README
	// advises: a producer that moves to a node that cannot answer (a
	// stopped process whose kernel still accepts, a black-holed address)
	// waits this long before it tries the next.
	connectFlag = flag.Duration("sitetest.connect", 3*time.Second, "a producer's CONNECT timeout: TCP connection and CONNACK together")
)

// binPath is the peat binary every test runs.
var binPath string

// enabled is the switch that keeps these tests out of `make test`: they
// run real processes for minutes (make test-cluster sets it).
const enabled = "PEAT_SITETEST"

// needSite skips a test that runs a site unless PEAT_SITETEST=1.
func needSite(t *testing.T) {
	t.Helper()
	if os.Getenv(enabled) != "1" {
		t.Skip("runs real peat processes for minutes: set " + enabled + "=1 (make test-cluster)")
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(enabled) != "1" {
		os.Exit(m.Run()) // the site tests skip; the checks' own tests run
	}
	binPath = *binFlag
	var dir string
	if binPath == "" {
		var err error
		dir, err = os.MkdirTemp("", "peat-sitetest-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		binPath = filepath.Join(dir, "peat")
		build := exec.Command("go", "build", "-o", binPath, "../../cmd/peat")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build peat: %v\n%s", err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}
