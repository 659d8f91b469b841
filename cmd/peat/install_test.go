package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/edge"
)

// installScript is scripts/install.sh, relative to this package.
var installScript = filepath.Join("..", "..", "scripts", "install.sh")

// runInstall runs scripts/install.sh with DESTDIR set and returns its exit
// status and combined output.
func runInstall(t *testing.T, destdir string, args ...string) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("scripts/install.sh needs bash: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{installScript}, args...)...)
	cmd.Env = append(cleanEnv(), "DESTDIR="+destdir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String()
	case err != nil:
		t.Fatalf("run install.sh: %v", err)
	}
	return 0, out.String()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeELF writes a file that starts like a Linux executable for the given
// ELF class and machine, followed by extra bytes (where Go keeps its build
// info, such as GOARM=6).
func fakeELF(t *testing.T, path string, class byte, machine uint16, extra string) {
	t.Helper()
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4] = class
	h[5] = 1 // little-endian
	binary.LittleEndian.PutUint16(h[18:], machine)
	if err := os.WriteFile(path, append(h, extra...), 0o755); err != nil {
		t.Fatal(err)
	}
}

// An install into a temporary root puts a runnable binary, the unit and a
// valid config in place; a second install (an upgrade) replaces the binary
// and keeps the operator's config.
func TestInstall_IntoDestdir(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	code, out := runInstall(t, root, "--binary", binPath)
	if code != 0 {
		t.Fatalf("install.sh exited %d:\n%s", code, out)
	}
	if !strings.Contains(out, "not creating the user") || !strings.Contains(out, "useradd --system") {
		t.Errorf("install.sh into %s should say it did not create the user, and how to; said:\n%s", root, out)
	}

	bin := filepath.Join(root, "usr/local/bin/peat")
	if st, err := os.Stat(bin); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v, mode %v; want mode 0755", err, st.Mode())
	}
	version, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(version), testVersion) {
		t.Errorf("installed peat version: %q, %v; want %s", version, err, testVersion)
	}

	unit := readFile(t, filepath.Join(root, "etc/systemd/system/peat.service"))
	if want := readFile(t, filepath.Join("..", "..", "configs", "peat.service")); !bytes.Equal(unit, want) {
		t.Error("installed unit differs from configs/peat.service")
	}
	for _, want := range []string{
		"ExecStart=/usr/local/bin/peat serve --config /etc/peat/peat.yaml --data /var/lib/peat",
		"User=peat", "StateDirectory=peat", "Restart=on-failure", "ProtectSystem=strict", "NoNewPrivileges=yes",
	} {
		if !bytes.Contains(unit, []byte("\n"+want+"\n")) {
			t.Errorf("unit lacks the line %q", want)
		}
	}

	configPath := filepath.Join(root, "etc/peat/peat.yaml")
	cfg, err := edge.LoadFile(configPath)
	if err != nil {
		t.Fatalf("installed config does not load: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("installed config is invalid: %v", err)
	}
	if cfg.DataDir != "/var/lib/peat" {
		t.Errorf("installed config data_dir = %q, want /var/lib/peat (the unit's StateDirectory)", cfg.DataDir)
	}

	// The operator edits the config; a new build is installed over the old.
	edited := append(readFile(t, configPath), "# edited by the operator\n"...)
	if err := os.WriteFile(configPath, edited, 0o640); err != nil {
		t.Fatal(err)
	}
	newBin := filepath.Join(t.TempDir(), "peat")
	// Bytes after a Go executable do not stop it from running.
	if err := os.WriteFile(newBin, append(readFile(t, binPath), "new build"...), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out = runInstall(t, root, "--binary", newBin)
	if code != 0 {
		t.Fatalf("second install.sh exited %d:\n%s", code, out)
	}
	if !bytes.Equal(readFile(t, configPath), edited) {
		t.Error("second install changed the operator's config")
	}
	if !strings.Contains(out, "kept "+configPath) {
		t.Errorf("second install should say it kept %s; said:\n%s", configPath, out)
	}
	if !bytes.Equal(readFile(t, bin), readFile(t, newBin)) {
		t.Error("second install did not replace the binary")
	}
	if _, err := exec.Command(bin, "version").Output(); err != nil {
		t.Errorf("upgraded binary does not run: %v", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(root, "*/*/*.new"))
	more, _ := filepath.Glob(filepath.Join(root, "*/*/*/*.new"))
	if len(leftovers)+len(more) > 0 {
		t.Errorf("temporary files left behind: %v %v", leftovers, more)
	}
}

// From a directory of cross-built binaries (make pi), install.sh picks the
// one for the target architecture, and refuses one that would not run there.
func TestInstall_PicksTheBinaryForTheArch(t *testing.T) {
	dist := t.TempDir()
	const (
		elf32, elf64          = 1, 2
		emARM, emAMD64, emA64 = 40, 62, 183
	)
	fakeELF(t, filepath.Join(dist, "peat-linux-amd64"), elf64, emAMD64, "amd64")
	fakeELF(t, filepath.Join(dist, "peat-linux-arm64"), elf64, emA64, "arm64")
	fakeELF(t, filepath.Join(dist, "peat-linux-armv7"), elf32, emARM, "build\tGOARM=7\n")
	fakeELF(t, filepath.Join(dist, "peat-linux-armv6"), elf32, emARM, "build\tGOARM=6\n")
	// The SHA256SUMS that make pi writes beside them.
	var sums strings.Builder
	for _, arch := range []string{"amd64", "arm64", "armv7", "armv6"} {
		fmt.Fprintf(&sums, "%x  peat-linux-%s\n", sha256.Sum256(readFile(t, filepath.Join(dist, "peat-linux-"+arch))), arch)
	}
	if err := os.WriteFile(filepath.Join(dist, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, arch := range []string{"arm64", "armv7", "armv6", "amd64"} {
		t.Run(arch, func(t *testing.T) {
			root := t.TempDir()
			code, out := runInstall(t, root, "--binary", dist, "--arch", arch)
			if code != 0 {
				t.Fatalf("install.sh --arch %s exited %d:\n%s", arch, code, out)
			}
			got := readFile(t, filepath.Join(root, "usr/local/bin/peat"))
			want := readFile(t, filepath.Join(dist, "peat-linux-"+arch))
			if !bytes.Equal(got, want) {
				t.Errorf("--arch %s installed %q, want peat-linux-%s", arch, got[64:], arch)
			}
			if !strings.Contains(out, "checksum of peat-linux-"+arch+" matches") {
				t.Errorf("install.sh did not check peat-linux-%s against SHA256SUMS:\n%s", arch, out)
			}
		})
	}

	t.Run("a binary for another arch is refused", func(t *testing.T) {
		code, out := runInstall(t, t.TempDir(), "--binary", filepath.Join(dist, "peat-linux-armv7"), "--arch", "armv6")
		if code == 0 || !strings.Contains(out, "armv7") || !strings.Contains(out, "does not run on armv6") {
			t.Errorf("armv7 binary for an armv6 board: exit %d, output:\n%s", code, out)
		}
	})
}

// install.sh fails, saying why and installing nothing, on input it must
// not install.
func TestInstall_RefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "peat.txt")
	if err := os.WriteFile(text, []byte("#!/bin/sh\necho not peat\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sumDir := t.TempDir()
	corrupt := filepath.Join(sumDir, "peat-linux-amd64")
	fakeELF(t, corrupt, 2, 62, "flipped bits")
	sums := strings.Repeat("0", 64) + "  peat-linux-amd64\n"
	if err := os.WriteFile(filepath.Join(sumDir, "SHA256SUMS"), []byte(sums), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing binary", []string{"--binary", filepath.Join(dir, "nope")}, "no binary at"},
		{"not an executable", []string{"--binary", text}, "not a Linux executable"},
		{"checksum mismatch", []string{"--binary", corrupt}, "does not match its checksum"},
		{"unknown arch", []string{"--binary", binPath, "--arch", "mips"}, "unknown --arch"},
		{"no binary for the arch", []string{"--binary", sumDir, "--arch", "arm64"}, "no peat-linux-* binary for arm64"},
		{"unknown flag", []string{"--frobnicate"}, "unknown argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			code, out := runInstall(t, root, c.args...)
			if code == 0 || !strings.Contains(out, c.want) {
				t.Errorf("install.sh %v: exit %d, want non-zero and %q in:\n%s", c.args, code, c.want, out)
			}
			if _, err := os.Stat(filepath.Join(root, "usr/local/bin/peat")); err == nil {
				t.Error("a binary was installed anyway")
			}
		})
	}
}

func TestInstall_Help(t *testing.T) {
	code, out := runInstall(t, t.TempDir(), "--help")
	if code != 0 || !strings.Contains(out, "Usage: scripts/install.sh") || !strings.Contains(out, "DESTDIR") {
		t.Errorf("install.sh --help: exit %d, output:\n%s", code, out)
	}
}
