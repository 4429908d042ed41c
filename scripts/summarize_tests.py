"""Counts individual test cases in meson's JUnit logs and prints the skipped
ones grouped by the reason they gave (no GPU, no PyTorch, ...), then one
closing line."""
import collections
import sys
import xml.etree.ElementTree as ET


def skip_reason(case):
    """The reason a skipped case gave, without the file:line gtest puts first."""
    skipped = case.find("skipped")
    text = (skipped.get("message") or skipped.text or "") if skipped is not None else ""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and ":" in lines[0] and lines[0].rsplit(":", 1)[1].isdigit():
        lines = lines[1:]
    return " ".join(lines).strip() or "(no reason given)"


passed = failed = skipped = 0
reasons = collections.Counter()
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1
            reasons[skip_reason(case)] += 1
        else:
            passed += 1
if reasons:
    print("skipped, by reason:")
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {count:4d}  {reason}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
