package edge

import (
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"github.com/peatmq/peat/edge/status"
)

// Files of the configuration that hold secrets (private keys, the Serf
// keyring, password hashes) or decide who may do what (ACL, tokens):
// a user or group other than Peat's that may read them can guess
// passwords offline or read the site's traffic; one that may write them
// can let itself in. Peat warns of such a file at start (a WARN line per
// file) and as the status alarm file_permissions, which `peat status`
// and `peat check` show, until it is fixed (each status request looks
// again). It does not refuse to start: an SD-card image made on another
// machine may carry modes the operator fixes later. Windows has no such
// modes and is not checked.

// sensitiveFile is a configured file and the field that names it.
type sensitiveFile struct{ field, path string }

// sensitiveFiles are the configured files others must not read or write.
func (c Config) sensitiveFiles() []sensitiveFile {
	var out []sensitiveFile
	add := func(field, path string) {
		if path != "" {
			out = append(out, sensitiveFile{field, path})
		}
	}
	add("auth.users_file", c.Auth.UsersFile)
	add("auth.acl_file", c.Auth.ACLFile)
	add("http.tokens_file", c.HTTP.TokensFile)
	add("http.tls.key_file", c.HTTP.TLS.KeyFile)
	for _, l := range c.mqttListeners() {
		add(l.field("tls.key_file"), l.tls.KeyFile)
	}
	if c.Cluster.Enabled() {
		add("cluster.keyring_file", c.Cluster.KeyringFile)
		add("cluster.tls.key_file", c.Cluster.TLS.KeyFile)
	}
	return out
}

// looseFiles says, for each sensitive file that its group or others
// may read or write, what is wrong and what to do.
func (c Config) looseFiles() []string {
	if runtime.GOOS == "windows" {
		return nil
	}
	var out []string
	for _, f := range c.sensitiveFiles() {
		fi, err := os.Stat(f.path)
		if err != nil {
			continue // reading it fails the start, or the reload, with its own error
		}
		if who := openTo(fi.Mode().Perm()); who != "" {
			out = append(out, fmt.Sprintf("%s %s is %s (mode %04o): chmod 600 it, owned by the user Peat runs as",
				f.field, f.path, who, fi.Mode().Perm()))
		}
	}
	return out
}

// openTo says who besides the owner may read or write a file of mode m.
func openTo(m fs.FileMode) string {
	var parts []string
	for _, w := range []struct {
		shift uint
		who   string
	}{{3, "group"}, {0, "others"}} {
		var can []string
		if m>>w.shift&4 != 0 {
			can = append(can, "readable")
		}
		if m>>w.shift&2 != 0 {
			can = append(can, "writable")
		}
		if len(can) > 0 {
			parts = append(parts, strings.Join(can, " and ")+" by "+w.who)
		}
	}
	return strings.Join(parts, ", ")
}

// warnLooseFiles logs a warning per sensitive file others may use.
func (n *Node) warnLooseFiles() {
	for _, msg := range n.cfg.looseFiles() {
		n.log.Warn("file permissions: " + msg)
	}
}

// fileAlarms is the file_permissions alarm, one per file.
func (n *Node) fileAlarms() []status.Alarm {
	var out []status.Alarm
	for _, msg := range n.cfg.looseFiles() {
		out = append(out, status.Alarm{ID: status.AlarmFilePermissions, Severity: status.SeverityWarning, Message: msg})
	}
	return out
}
