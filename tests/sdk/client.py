"""LangGraph's official Python client (`langgraph-sdk`, unpatched) against `ferrograph serve`.

Usage: python client.py URL [--triage INPUT.json]

Walks what a LangGraph user does: finds the graphs as assistants, creates a thread, runs
`review` to its interrupt, reads the state and the interrupt, resumes with `Command`, streams a
run in `values` and `updates` (the fan-out `demo`, and `triage` on the real model with
`--triage`, whose input is in the file given), reads the history, forks from a checkpoint, uses the store, and checks that
errors arrive as HTTP errors. Exits non-zero on the first thing that is not as LangGraph's
server would answer.
"""

import json
import sys

from langgraph_sdk import get_sync_client
from langgraph_sdk.schema import Command


def check(cond, what, detail=None):
    if not cond:
        raise SystemExit(f"FAILED: {what}" + (f"\n{detail}" if detail is not None else ""))
    print(f"ok: {what}")


def main():
    url = sys.argv[1]
    triage = None
    if "--triage" in sys.argv:
        with open(sys.argv[sys.argv.index("--triage") + 1]) as f:
            triage = json.load(f)
        triage["out_dir"] = "sdk-triage-py"
    client = get_sync_client(url=url, api_key=None)

    # Assistants: every workflow is a graph with a default assistant.
    assistants = client.assistants.search(limit=50)
    graphs = {a["graph_id"]: a for a in assistants}
    check("review" in graphs and "demo" in graphs, "assistants.search lists the workflows", graphs.keys())
    review = client.assistants.get(graphs["review"]["assistant_id"])
    check(review["graph_id"] == "review", "assistants.get by id")
    drawing = client.assistants.get_graph("review")
    ids = {n["id"] for n in drawing["nodes"]}
    check({"__start__", "human_review"} <= ids, "assistants.get_graph draws the graph", ids)
    schemas = client.assistants.get_schemas("review")
    check(schemas["graph_id"] == "review", "assistants.get_schemas")
    mine = client.assistants.create(graph_id="review", config={"recursion_limit": 40}, name="strict review")
    check(mine["name"] == "strict review" and mine["version"] == 1, "assistants.create")
    mine = client.assistants.update(mine["assistant_id"], metadata={"team": "docs"})
    check(mine["version"] == 2 and mine["metadata"]["team"] == "docs", "assistants.update makes a version")

    # A thread, run to its interrupt.
    thread = client.threads.create(metadata={"user": "ann", "n": 1})
    tid = thread["thread_id"]
    check(thread["status"] == "idle" and thread["metadata"] == {"user": "ann", "n": 1}, "threads.create", thread)
    out = client.runs.wait(tid, "review", input={"title": "Retry only on rate limits"})
    check("__interrupt__" in out, "runs.wait stops at the review interrupt", out)
    intr = out["__interrupt__"][0]
    check(intr["value"]["kind"] == "review" and intr["id"], "the interrupt carries the review payload", intr)

    state = client.threads.get_state(tid)
    check(state["next"] == ["human_review"], "threads.get_state: next", state["next"])
    check(state["interrupts"] and state["interrupts"][0]["id"] == intr["id"], "threads.get_state: the interrupt")
    check(state["checkpoint"]["checkpoint_id"], "threads.get_state: the checkpoint")
    t = client.threads.get(tid)
    check(t["status"] == "interrupted" and any(t["interrupts"].values()), "threads.get: interrupted", t)
    found = client.threads.search(status="interrupted", metadata={"user": "ann"})
    check(any(x["thread_id"] == tid for x in found), "threads.search by status and metadata")

    # Resume with approve through Command.
    out = client.runs.wait(tid, "review", command=Command(resume="approve"))
    check("__interrupt__" not in out and out.get("decision") == "approved", "Command(resume='approve') finishes the review", out)
    check(client.threads.get(tid)["status"] == "idle", "the thread is idle again")

    # History, and a fork from the checkpoint where the review waited.
    history = client.threads.get_history(tid, limit=20)
    check(len(history) >= 3, "threads.get_history", len(history))
    waiting = next(h for h in history if h["next"] == ["human_review"])
    fork = client.threads.copy(tid)
    check(fork["thread_id"] != tid and fork["values"] == history[0]["values"], "threads.copy")
    branched = client.threads.update_state(
        tid, {"title": "Retry on 429 and 503"}, checkpoint_id=waiting["checkpoint"]["checkpoint_id"]
    )
    check(branched["checkpoint"]["checkpoint_id"], "threads.update_state at an older checkpoint")
    check(client.threads.get_state(tid)["next"] == ["human_review"], "the branch waits for the review again")
    out = client.runs.wait(tid, "review", input=None)
    check(out["__interrupt__"][0]["value"]["title"] == "Retry on 429 and 503", "the branch asks again, with the new title", out)
    out = client.runs.wait(tid, "review", command=Command(resume="approve"))
    check(out.get("title") == "Retry on 429 and 503" and out.get("decision") == "approved", "the fork reruns from there", out)

    # A background run, joined; listed.
    t2 = client.threads.create()
    run = client.runs.create(t2["thread_id"], "review", input={"title": "Background"})
    check(run["status"] in ("pending", "running", "interrupted"), "runs.create in the background", run)
    joined = client.runs.join(t2["thread_id"], run["run_id"])
    check("__interrupt__" in joined, "runs.join waits for the interrupt", joined)
    got = client.runs.get(t2["thread_id"], run["run_id"])
    check(got["status"] == "interrupted", "runs.get: interrupted", got)
    check(any(r["run_id"] == run["run_id"] for r in client.runs.list(t2["thread_id"])), "runs.list")

    # Streaming values and updates (the fan-out demo; triage on the real model).
    t3 = client.threads.create()
    commits = ["feat: stream tokens from local models", "fix: resume after a crash no longer repeats a step",
               "docs: explain durability modes", "chore: bump dependencies"]
    events = list(client.runs.stream(t3["thread_id"], "demo", input={"commits": commits}, stream_mode=["values", "updates"]))
    kinds = [e.event for e in events]
    check(kinds[0] == "metadata" and "values" in kinds and "updates" in kinds, "runs.stream: metadata, values, updates", kinds)
    check("error" not in kinds, "runs.stream: no error")
    last = [e.data for e in events if e.event == "values"][-1]
    check(last.get("markdown"), "the demo's final values have release notes", last)
    if triage:
        t4 = client.threads.create()
        seen = []
        for part in client.runs.stream(t4["thread_id"], "triage", input=triage, stream_mode=["values", "updates"]):
            seen.append(part)
        kinds = [p.event for p in seen]
        updated = {n for p in seen if p.event == "updates" for n in p.data}
        check("error" not in kinds, "triage streamed without error", [p.data for p in seen if p.event == "error"])
        check(len(updated) >= 4, "triage's agents each sent updates", updated)
        final = [p.data for p in seen if p.event == "values"][-1]
        check(final.get("status") == "COMPLETED", "triage completed", final.get("status"))
        files = [f["path"] for f in (final.get("codebase") or {}).get("relevant_files", [])]
        check(any(f.endswith("ledgerlite/discounts.py") for f in files), "triage found the planted file", files)
        report = (final.get("writer") or {}).get("report", {})
        check(len(report.get("root_cause", "").split()) >= 5 and report.get("root_cause") != report.get("suggested_fix"),
              "triage's report has a root cause of its own", report)

    # A chat turn on `chatbot` (the real model), messages written and read LangChain's way.
    chat = client.threads.create()
    out = client.runs.wait(chat["thread_id"], "chatbot",
                           input={"messages": [{"role": "user", "content": "What color is the sky on a clear day?"}]})
    last = out["messages"][-1]
    check([m["type"] for m in out["messages"]] == ["human", "ai"] and "blue" in last["content"].lower(),
          "runs.wait answers LangChain messages", out["messages"])

    # Store.
    client.store.put_item(["users", "ann"], "prefs", {"tone": "short"})
    item = client.store.get_item(["users", "ann"], "prefs")
    check(item["value"] == {"tone": "short"}, "store.put_item / get_item")
    res = client.store.search_items(["users"], filter={"tone": "short"})
    check(len(res["items"]) == 1, "store.search_items", res)
    check(["users", "ann"] in client.store.list_namespaces(prefix=["users"])["namespaces"], "store.list_namespaces")
    client.store.delete_item(["users", "ann"], "prefs")

    # Errors are HTTP errors.
    import httpx

    for what, call in [
        ("an unknown thread", lambda: client.threads.get("no-such-thread")),
        ("an unknown graph", lambda: client.runs.wait(None, "no-such-graph", input={})),
        ("a resume with nothing to answer", lambda: client.runs.wait(tid, "review", command=Command(resume="approve"))),
    ]:
        try:
            call()
        except httpx.HTTPStatusError as e:
            check(400 <= e.response.status_code < 500, f"{what} is refused with {e.response.status_code}")
        else:
            check(False, f"{what} is refused")

    client.threads.delete(t2["thread_id"])
    print("all Python SDK checks passed")


if __name__ == "__main__":
    main()
