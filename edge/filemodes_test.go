package edge

import (
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/peatmq/peat/edge/status"
)

// Every sensitive file others may read or write is named in the status
// alarms with its field; a file only its owner may use is not.
func TestNode_AlarmsForFilesOthersMayUse(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix file modes")
	}
	dir := t.TempDir()
	p := newTestPKI(t, "unused")
	cfg := testConfig(t)
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "alice", "pw"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", "allow readwrite * #\n")
	cfg.MQTT.TLS = TLSConfig{CertFile: p.certFile, KeyFile: p.keyFile}
	for f, mode := range map[string]os.FileMode{cfg.Auth.UsersFile: 0o640, cfg.Auth.ACLFile: 0o602, p.keyFile: 0o600} {
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	n := startNode(t, cfg)
	code, _, body := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/api/v1/status")
	var st status.Status
	if code != http.StatusOK || json.Unmarshal(body, &st) != nil {
		t.Fatalf("GET /api/v1/status: %d %s", code, body)
	}
	var got []string
	for _, a := range st.Alarms {
		if a.ID == status.AlarmFilePermissions {
			got = append(got, a.Message)
		}
	}
	want := []string{"auth.users_file " + cfg.Auth.UsersFile + " is readable by group (mode 0640)",
		"auth.acl_file " + cfg.Auth.ACLFile + " is writable by others (mode 0602)"}
	if len(got) != len(want) {
		t.Fatalf("file_permissions alarms %q, want %d", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("alarm %q, want it to start %q", got[i], want[i])
		}
	}
}
