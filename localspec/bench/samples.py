"""Reference prompts shared by `localspec bench` and the tests that check the same claims.

PROSE: open prose, where prompt lookup barely matches. REWRITE + REWRITE_START: a code rewrite sent the way an
editor's rewrite request is (the answer's first line already given), where the answer mostly copies the input.
"""

PROSE = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
         "Explain how a bicycle stays upright while moving."]
CODE = '''def parse_config(path):
    with open(path) as f:
        lines = f.readlines()
    result = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        result[key.strip()] = value.strip()
    return result
'''
REWRITE = f"Rename the variable `result` to `config` in this function:\n```python\n{CODE}```"
REWRITE_START = "```python\ndef parse_config(path):"

# -- copy-heavy work for prompt lookup (docs/bench/lookup.md): several prompts per task, written for this
# project. Each answer mostly repeats text the prompt gives, which is where lookup should beat llama.cpp's own.

_NOTICE = ("The Harbour Street swimming pool will close for maintenance from 3 June to 17 June. During the closure "
           "the changing rooms will be retiled, the main pool will be drained and repainted, and the filtration "
           "system will be replaced. Members with a monthly pass will have their pass extended by two weeks at no "
           "cost. Lessons booked for the closure period will move to the Northgate pool at the same times. The "
           "sauna and the gym stay open as usual, from 6 am to 10 pm on weekdays and from 8 am to 8 pm at weekends.")
_MINUTES = ("Minutes of the garden committee, 9 May. Present: Ana, Ben, Chloe, Dev. Ana reported that the new "
            "compost bins arrived on 2 May and are installed behind the shed. Ben said the water bill for April "
            "was 84 euros, up from 61 euros in March, because of the leaking tap near the greenhouse. Chloe will "
            "ask a plumber for a quote by 20 May. Dev proposed a plant swap on Saturday 1 June from 10 am to 1 pm; "
            "the committee agreed. The next meeting is on 13 June at 7 pm in the community hall.")
_GUIDE = ("To reset the router, keep it switched on and press the small reset button on the back for ten seconds "
          "with a paper clip. The lights will blink orange, then turn green after about two minutes. Connect to "
          "the network named HomeBox-Setup and open 192.168.1.1 in a browser. The default password is printed on "
          "the sticker under the router. Choose a new network name and a password of at least twelve characters, "
          "then press Save. The router restarts once more and is ready when the light is steady green.")

_CODE_INVOICE = '''def invoice_total(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    total = subtotal + tax
    return round(total, 2)


def print_invoice(items, tax_rate):
    for item in items:
        print(item["name"], item["quantity"], item["price"])
    print("total", invoice_total(items, tax_rate))
'''
_CODE_JS = '''function averageScore(students) {
  let sum = 0;
  for (const s of students) {
    sum += s.score;
  }
  return students.length ? sum / students.length : 0;
}

function topStudents(students, n) {
  return [...students].sort((a, b) => b.score - a.score).slice(0, n);
}
'''

LOOKUP_TASKS: dict[str, list[str]] = {
    "rag": [f"Answer from the notice only, quoting it where you can.\n\nNotice: {_NOTICE}\n\n"
            "Question: What happens to lessons and to monthly passes during the closure?",
            f"Use the minutes to answer.\n\n{_MINUTES}\n\nQuestion: What was said about the water bill, and who "
            "will do what about it?",
            f"Here is a product guide.\n\n{_GUIDE}\n\nQuestion: Give me the steps to reset the router, in order."],
    "json": [f"Extract every date and what happens on it from this text as a JSON list of objects with the keys "
             f"\"date\" and \"event\". Copy the wording.\n\n{_MINUTES}",
             f"Return a JSON object with the keys \"closed_from\", \"closed_until\", \"work\" (a list of the jobs, "
             f"in the notice's words) and \"open_facilities\".\n\n{_NOTICE}",
             'Convert to a JSON array of objects with "name", "role" and "email":\n'
             "Maria Lopez, head of finance, maria.lopez@example.org\nTom Becker, lead engineer, "
             "tom.becker@example.org\nAisha Khan, designer, aisha.khan@example.org\nJonas Berg, support "
             "manager, jonas.berg@example.org"],
    "rename": [f"Rename `subtotal` to `net` everywhere and output the whole code, nothing else.\n"
               f"```python\n{_CODE_INVOICE}```",
               f"Rename the function `averageScore` to `meanScore` and output the whole file.\n```js\n{_CODE_JS}```",
               f"Rename the parameter `items` to `lines` in both functions. Output the complete code.\n"
               f"```python\n{_CODE_INVOICE}```"],
    "rewrite": [f"Rewrite this notice with British spelling checked and one sentence per line. Keep every "
                f"detail.\n\n{_NOTICE}",
                f"Turn these minutes into a bulleted list, one bullet per sentence, keeping the wording.\n\n{_MINUTES}",
                f"Rewrite these instructions as numbered steps. Keep the exact wording of each step.\n\n{_GUIDE}"],
}
LOOKUP_PROSE = PROSE + ["Describe a city at night in the rain, in a few vivid paragraphs."]

# Held out: other documents and code, the same four kinds of task. A drafting rule tuned on LOOKUP_TASKS' answers
# is checked on these before it is kept (docs/bench/lookup.md#lookup-priors).
_LIBRARY = ("The Riverside Library will move to a new building at 14 Mill Lane on 1 September. The old building on "
            "Church Road closes on 20 August, and books borrowed before then can be returned to either address until "
            "the end of September. The new library has a children's room on the ground floor, a quiet study area on "
            "the first floor and twelve public computers. Opening hours stay the same: 9am to 6pm on weekdays and "
            "10am to 4pm on Saturdays. Parking is free for the first two hours. Volunteers who want to help with "
            "the move should email Priya Shah before 10 August.")
_NOTES = ("Meeting notes, project Atlas, 12 March. Attendees: Lena, Omar, Sofia, Raj. Lena said the database "
          "migration finished on 8 March and took four hours longer than planned because of a locked table. Omar "
          "reported that the new login page is ready for review and asked for feedback by Friday. Sofia will contact "
          "the vendor about the invoice for February, which was 1,200 dollars instead of the agreed 950. Raj proposed "
          "moving the weekly meeting from Tuesday to Thursday. The next release is planned for 2 April.")
_DESCALE = ("To descale the coffee machine, fill the water tank with one part vinegar and two parts water. Place a "
            "large cup under the spout and press the hot water button until the tank is half empty. Wait twenty "
            "minutes, then run the rest of the mixture through. Rinse the tank and run two full tanks of clean water "
            "to remove the taste of vinegar. Descale every three months, or every month if your water is hard.")
_CODE_ORDERS = ("```python\ndef load_orders(path):\n    orders = []\n    with open(path) as f:\n"
                "        for line in f:\n"
                "            order_id, customer, amount = line.strip().split(\",\")\n"
                "            orders.append({\"id\": order_id, \"customer\": customer, "
                "\"amount\": float(amount)})\n"
                "    return orders\n\n\ndef total_by_customer(orders):\n    totals = {}\n    for order in orders:\n"
                "        totals[order[\"customer\"]] = totals.get(order[\"customer\"], 0) + order[\"amount\"]\n"
                "    return totals\n```")
_CODE_CONFIG = ("```js\nfunction parseConfig(text) {\n  const config = {};\n"
                "  for (const line of text.split(\"\\n\")) {\n"
                "    const [key, value] = line.split(\"=\");\n    if (key && value) {\n"
                "      config[key.trim()] = value.trim();\n    }\n  }\n  return config;\n}\n\n"
                "function getPort(config) {\n  return Number(config.port || 8080);\n}\n```")
LOOKUP_HELD_OUT: dict[str, list[str]] = {
    "rag": [f"Answer from the text only, quoting it where you can.\n\n{_LIBRARY}\n\nQuestion: What will the new "
            "library have, and when does the old one close?",
            f"Use the notes to answer.\n\n{_NOTES}\n\nQuestion: What did Sofia and Raj say?",
            f"Here are instructions.\n\n{_DESCALE}\n\nQuestion: How do I descale the machine and how often?",
            f"Answer using only this text.\n\n{_LIBRARY}\n\nQuestion: What are the opening hours and who should "
            "volunteers contact?"],
    "json": [f"Return a JSON object with the keys \"new_address\", \"moving_date\", \"old_building_closes\" and "
             f"\"facilities\" (a list, in the text's words).\n\n{_LIBRARY}",
             f"Extract every person and what they said as a JSON list of objects with the keys \"name\" and "
             f"\"said\". Copy the wording.\n\n{_NOTES}",
             f"Convert the steps to a JSON array of strings, one per sentence, keeping the wording.\n\n{_DESCALE}",
             'Convert to a JSON array of objects with "city", "country" and "population":\nLyon, France, 522000\n'
             "Porto, Portugal, 232000\nGhent, Belgium, 263000\nMalmo, Sweden, 357000\nBrno, Czechia, 382000"],
    "rename": [f"Rename `orders` to `records` everywhere and output the whole code, nothing else.\n{_CODE_ORDERS}",
               f"Rename the function `parseConfig` to `readConfig` and output the whole file.\n{_CODE_CONFIG}",
               f"Rename the variable `totals` to `sums` and output the complete code.\n{_CODE_ORDERS}",
               f"Rename `config` to `settings` everywhere. Output the complete code.\n{_CODE_CONFIG}"],
    "rewrite": [f"Rewrite this text with one sentence per line. Keep every detail.\n\n{_LIBRARY}",
                f"Turn these notes into a bulleted list, one bullet per sentence, keeping the wording.\n\n{_NOTES}",
                f"Rewrite these instructions as numbered steps. Keep the exact wording of each step.\n\n{_DESCALE}",
                f"Rewrite the notes in the past tense, one sentence per line.\n\n{_NOTES}"],
}

# a multi-turn chat about one document, and editor requests over one file: the cross-request cache's cases
CHAT_TURNS = [f"Here is a notice from my swimming pool:\n\n{_NOTICE}\n\nSummarise it in three sentences.",
              "Which facilities stay open, and when exactly?",
              "Write a short email to a friend telling them about the closure, quoting the dates.",
              "Now list every change the notice mentions, word for word."]
# the same document in a new chat (ctrl+n in the chat app, a new conversation in a client): the first chat's
# answers are in no prompt of the second, only in the engine's cross-request cache
NEW_CHAT_TURNS = [f"My swimming pool sent this notice:\n\n{_NOTICE}\n\nWhat does it say? Three sentences, please.",
                  "When are the sauna and the gym open?"]
# the second question of CHAT_TURNS, edited by the user and sent again: the answer it had is in no prompt now
EDITED_TURN = "Which facilities stay open during the closure, and at what times?"
EDITOR_FILE = _CODE_INVOICE
# tests for one file, request after request: each answer repeats the previous answers' scaffolding (imports, test
# data), which no prompt holds: where the cross-request cache has something to give
TEST_REQUESTS = ["Write pytest tests for invoice_total. Output only the test file.",
                 "Write pytest tests for print_invoice. Output only the test file.",
                 "Write pytest tests for invoice_total with an empty list and with a tax rate of 0. Output only the "
                 "test file.",
                 "Write pytest tests that check invoice_total rounds to 2 decimals. Output only the test file."]
# code completion in an editor, a suggestion's first line accepted at a time (llama.vim's Shift-Tab, an IDE's
# "accept line"): each request is the file up to the cursor, so the rest of the last suggestion is in no prompt of
# the next request, only in the cross-request cache
COMPLETION_PREFIX = (_CODE_INVOICE + "\n\ndef invoice_summary(items, tax_rate):\n"
                     '    """Return the subtotal, the tax and the total of the items as a dict."""\n')
EDITOR_REQUESTS = ["Add a docstring to each function. Output the whole file.",
                   "Rename `tax_rate` to `vat`. Output the whole file.",
                   "Make print_invoice use f-strings. Output the whole file.",
                   "Add type hints to both functions. Output the whole file."]
