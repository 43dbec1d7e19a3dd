package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// softrnic sim dcqcn says what it ran, on stdout and in summary.json, and
// --seeds writes the spread (sweep.json) and every seed's rates (sweep.csv).
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := simDCQCN([]string{"--duration", "12ms", "--set", "rpg_time_reset=150", "--out", dir}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "profile connectx") || !strings.Contains(s, "rpg_time_reset=150") || !strings.Contains(s, "RED 5/200 KB/1 %") {
		t.Fatalf("the run does not say what it ran:\n%s", s)
	}
	var sum struct {
		Config struct {
			Profile string            `json:"profile"`
			Knobs   map[string]uint32 `json:"knobs"`
		} `json:"config"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sum); err != nil || sum.Config.Profile != "connectx" || sum.Config.Knobs["rpg_time_reset"] != 150 {
		t.Fatalf("summary.json config %+v (%v)", sum.Config, err)
	}

	dir = t.TempDir()
	out.Reset()
	if err := simDCQCN([]string{"--duration", "12ms", "--seeds", "2", "--np", "grid", "--order", "alpha-then-cut", "--out", dir}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "seeds 1–2") || !strings.Contains(s, "grid true") || !strings.Contains(s, "alpha-then-cut") {
		t.Fatalf("sweep output:\n%s", s)
	}
	var sw struct {
		Seeds  []uint64 `json:"seeds"`
		Config struct {
			NP struct {
				Grid bool `json:"grid"`
			} `json:"np"`
		} `json:"config"`
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.json")); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sw); err != nil || len(sw.Seeds) != 2 || !sw.Config.NP.Grid {
		t.Fatalf("sweep.json %+v (%v)", sw, err)
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.csv")); err != nil || strings.Count(string(b), "\n") != 5 {
		t.Fatalf("sweep.csv %q (%v): want a header and 4 rows", b, err)
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.svg")); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("window mean per seed")) {
		t.Fatalf("sweep.svg: %v", err)
	}

	for _, bad := range [][]string{{"--np", "bogus"}, {"--order", "x"}, {"--profile", "connectx", "--np", "grid"}} {
		if err := simDCQCN(append(bad, "--out", t.TempDir()), &out, &errb); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
