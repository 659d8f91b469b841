package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A tokens file others may read or write is warned of when the node
// starts, and `peat check` reports it as a WARNING until it is fixed.
func TestCheck_WarnsOfFilesOthersMayRead(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix file modes")
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	code, tok, stderr := runPeat(t, nil, "token", tokens, "nagios", "read")
	if code != exitOK {
		t.Fatalf("peat token: %d %s", code, stderr)
	}
	if err := os.Chmod(tokens, 0o664); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(cfg, []byte("http:\n  tokens_file: "+tokens+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, filepath.Join(dir, "data"), "--config", cfg)
	if log := p.log(); !strings.Contains(log, "http.tokens_file") || !strings.Contains(log, "chmod 600") {
		t.Errorf("no start warning naming http.tokens_file:\n%s", log)
	}
	env := []string{"PEAT_TOKEN=" + strings.TrimSpace(tok)}
	code, out, _ := runPeat(t, env, "check", "--http", p.httpAddr)
	if code != checkWarning || !strings.HasPrefix(out, "PEAT WARNING - file_permissions: ") || !strings.Contains(out, tokens) {
		t.Errorf("peat check: exit %d, %q; want 1 and a WARNING naming %s", code, out, tokens)
	}
	if err := os.Chmod(tokens, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runPeat(t, env, "check", "--http", p.httpAddr); code != checkOK {
		t.Errorf("peat check after chmod 600: exit %d, %q; want OK", code, out)
	}
}
