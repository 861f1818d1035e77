"""The synthetic multi-hop world: a generated fictional world no pretrained model knows.

People, organisations, cities, countries and works, linked by typed relations, each with
one document; plus distractor documents about near-named entities. Questions follow
relation chains of 1 to 4 hops (HotpotQA-style bridge questions) or compare two or three
entities. The hop mix and the comparison share are quotas, met in every split to the
nearest question.

What makes it hard (dialled by `difficulty`): facts stated only in the *other* entity's
document (reverse-stated relations, so the first query must be reformulated), entities
named by an alias or a description instead of their name, paraphrased question and
sentence templates, near-duplicate names and distractor documents that mention the real
entity. Splits are disjoint by construction: each split's questions are drawn from its own
cluster of entities, so no test question touches an entity that a train question does.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seekrl.data import names as nm
from seekrl.data.qa import QAExample

SPLITS = ("train", "dev", "test")
_COMMON_WORDS = {"The", "of"} | {w for suffixes, _ in nm.ORG_KINDS.values()
                                 for suffix in suffixes for w in suffix.split()}


def _org_stem(name: str) -> str:
    """An organisation's short name: its own word, not the kind's ("College of Ruon" is
    "Ruon"; taking the first word called two organisations of every world "College" and
    "Institute", which named a dozen others too)."""
    for kind in nm.ORG_KINDS["university"][0]:
        if name.startswith(f"{kind} of "):
            return name[len(kind) + 4:].split(" ")[0]
    return name.split(" ")[0]


# --------------------------------------------------------------------------- config


@dataclass
class WorldConfig:
    """Every knob of the world. `difficulty` picks defaults; explicit fields override."""

    seed: int = 0
    difficulty: str = "medium"
    entities: int = 1500            # real entities, all splits together (distractors extra)
    n_train: int = 2000
    n_dev: int = 200
    n_test: int = 200
    # share of entities per split cluster (train, dev, test)
    split_shares: tuple[float, float, float] = (0.7, 0.15, 0.15)
    # The knobs below default to None: `difficulty` fills the ones left unset.
    hop_mix: dict[int, float] | None = None  # chain length -> weight
    comparison_share: float | None = None   # share of questions that compare entities
    distractors: float | None = None        # mean distractor documents per real entity
    paraphrase: bool | None = None          # several templates per sentence and question
    reverse_rate: float | None = None       # chance a relation is told only in the object's doc
    alias_rate: float | None = None         # chance a question names an entity by its alias
    description_rate: float | None = None   # chance a question describes its first entity
    near_dup_rate: float | None = None      # chance a new name is one vowel from an old one
    mention_rate: float | None = None       # chance a distractor doc names its real namesake
    # document length in words: filler sentences are added up to a target drawn from this
    # range (short documents make a cheaper world for CPU training; facts are never cut)
    doc_words: tuple[int, int] = (60, 125)

    def __post_init__(self) -> None:
        if self.difficulty not in PRESETS:
            raise ValueError(f"difficulty: expected one of {sorted(PRESETS)}, "
                             f"got {self.difficulty!r}")
        for key, value in PRESETS[self.difficulty].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        self.split_shares = tuple(self.split_shares)
        shares = self.split_shares
        if (len(shares) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                        and math.isfinite(v) and v >= 0 for v in shares)
                or sum(shares) <= 0):
            # a negative share had become a 20-entity split, a pair had lost the test split
            raise ValueError(f"split_shares: expected three finite shares >= 0 (train, dev, "
                             f"test) with a positive sum, got {shares}")
        self.doc_words = tuple(self.doc_words)
        if len(self.doc_words) != 2 or not 0 <= self.doc_words[0] < self.doc_words[1]:
            raise ValueError(f"doc_words: expected (low, high) with 0 <= low < high, "
                             f"got {self.doc_words}")
        self.hop_mix = {int(k): float(v) for k, v in self.hop_mix.items()}
        bad = [h for h in self.hop_mix if not 1 <= h <= 4]
        if bad:
            raise ValueError(f"hop_mix: hops must be 1..4, got {bad}")
        if (min(self.hop_mix.values(), default=-1) < 0 or sum(self.hop_mix.values()) <= 0
                or not all(math.isfinite(v) for v in self.hop_mix.values())):
            raise ValueError(f"hop_mix: weights must be finite and >= 0 with a positive sum, "
                             f"got {self.hop_mix}")
        if not (math.isfinite(self.distractors) and self.distractors >= 0):
            raise ValueError(f"distractors: expected a finite mean >= 0, got "
                             f"{self.distractors}")
        for name in ("n_train", "n_dev", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a number of questions >= 0, got "
                                 f"{getattr(self, name)}")
        if self.entities < 60:
            raise ValueError(f"entities: need at least 60 to make three splits, "
                             f"got {self.entities}")
        for name in ("comparison_share", "reverse_rate", "alias_rate", "description_rate",
                     "near_dup_rate", "mention_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: expected a value in [0, 1], got {getattr(self, name)}")


PRESETS: dict[str, dict] = {
    # Single template, names only, 1-2 hops: learnable by imitation alone.
    "easy": dict(hop_mix={1: 0.5, 2: 0.5}, comparison_share=0.0, distractors=0.0,
                 paraphrase=False, reverse_rate=0.0, alias_rate=0.0, description_rate=0.0,
                 near_dup_rate=0.0, mention_rate=0.0),
    "medium": dict(hop_mix={1: 0.2, 2: 0.35, 3: 0.3, 4: 0.15}, comparison_share=0.2,
                   distractors=1.0, paraphrase=True, reverse_rate=0.3, alias_rate=0.25,
                   description_rate=0.2, near_dup_rate=0.25, mention_rate=0.4),
    "hard": dict(hop_mix={2: 0.3, 3: 0.4, 4: 0.3}, comparison_share=0.3, distractors=2.0,
                 paraphrase=True, reverse_rate=0.5, alias_rate=0.4, description_rate=0.35,
                 near_dup_rate=0.4, mention_rate=0.6),
}


# --------------------------------------------------------------------------- entities


@dataclass
class Entity:
    key: str
    type: str                       # person | org | city | country | work
    name: str
    split: str
    attrs: dict = field(default_factory=dict)
    rels: dict[str, str] = field(default_factory=dict)       # relation -> entity key
    alias: str | None = None
    distractor: bool = False
    doc_id: str = ""
    stated_in_object: set[str] = field(default_factory=set)  # relations told in the object's doc


@dataclass(frozen=True)
class Relation:
    subj: str
    obj: str
    forward: tuple[str, ...]     # sentences in the subject's doc: {s} subject, {o} object
    reverse: tuple[str, ...]     # sentences in the object's doc
    noun_phrase: tuple[str, ...]  # "the founder of {x}"
    ask: tuple[str, ...]          # "Who founded {x}?"
    query_forward: str           # how an expert searches when the fact is in {s}'s doc
    query_reverse: str           # ... and when it is only in the object's doc


RELATIONS: dict[str, Relation] = {
    "born_in": Relation(
        "person", "city",
        ("{s} was born in {o}.", "Born in {o}, {s} grew up there.",
         "{s}'s birthplace was the city of {o}."),
        ("{o} is the birthplace of {s}.", "Among the people born in {o} is {s}."),
        ("the city where {x} was born", "the birthplace of {x}", "the city of birth of {x}"),
        ("In which city was {x} born?", "Where was {x} born?", "What is the birthplace of {x}?"),
        "{s} born", "birthplace of {s}"),
    "spouse": Relation(
        "person", "person",
        ("{s} was married to {o}.", "{s} married {o}.", "{s}'s spouse was {o}."),
        ("{o} was married to {s}.", "{o} married {s}."),
        ("the spouse of {x}", "the person {x} married", "the husband or wife of {x}"),
        ("Who was {x} married to?", "Who was the spouse of {x}?", "Whom did {x} marry?"),
        "{s} married", "married to {s}"),
    "employer": Relation(
        "person", "org",
        ("{s} worked for {o}.", "{s} spent most of a long career at {o}.",
         "{s} joined {o} early on."),
        ("{o} employed {s} for many years.", "Notable staff of {o} included {s}."),
        ("the employer of {x}", "the organisation {x} worked for",
         "the institution that employed {x}"),
        ("Which organisation did {x} work for?", "Who employed {x}?", "Where did {x} work?"),
        "{s} worked for", "employed {s}"),
    "founder": Relation(
        "org", "person",
        ("{s} was founded by {o}.", "{o} established {s}.", "The founder of {s} was {o}."),
        ("{o} founded {s}.", "{o} is remembered as the founder of {s}."),
        ("the founder of {x}", "the person who founded {x}", "whoever established {x}"),
        ("Who founded {x}?", "Who established {x}?", "Who was the founder of {x}?"),
        "{s} founded by", "founded {s}"),
    "hq": Relation(
        "org", "city",
        ("{s} is headquartered in {o}.", "The headquarters of {s} are in {o}.",
         "{s} has its head office in {o}."),
        ("{o} is home to the headquarters of {s}.", "{s} keeps its head office in {o}."),
        ("the city where {x} is headquartered", "the headquarters city of {x}",
         "the city that hosts the head office of {x}"),
        ("Where is {x} headquartered?", "In which city is {x} based?",
         "In what city does {x} have its headquarters?"),
        "{s} headquarters", "headquarters of {s}"),
    "country": Relation(
        "city", "country",
        ("{s} is a city in {o}.", "{s} lies in {o}.", "{s} is located in {o}."),
        ("{o} includes the city of {s}.", "The cities of {o} include {s}."),
        ("the country where {x} is located", "the country that contains {x}",
         "the country {x} lies in"),
        ("In which country is {x}?", "Which country is {x} located in?",
         "{x} is in which country?"),
        "{s} city country", "city of {s}"),
    "capital": Relation(
        "country", "city",
        ("The capital of {s} is {o}.", "{s}'s capital city is {o}.",
         "{o} serves as the capital of {s}."),
        ("{o} is the capital of {s}.", "{o} has been the capital city of {s} since independence."),
        ("the capital of {x}", "the capital city of {x}", "the seat of government of {x}"),
        ("What is the capital of {x}?", "Which city is the capital of {x}?",
         "What city serves as the capital of {x}?"),
        "{s} capital", "capital of {s}"),
    "creator": Relation(
        "work", "person",
        ("{s} is a {kind} {made_pp} by {o}.", "{o} {made} the {kind} {s}.",
         "The {kind} {s} was {made_pp} by {o}."),
        ("{o} {made} the {kind} {s}.", "Among the works of {o} is the {kind} {s}."),
        ("the {maker} of {x}", "the person who {made} {x}", "the creator of {x}"),
        ("Who {made} {x}?", "Who was the {maker} of {x}?", "Which person {made} {x}?"),
        "{s} {kind} {made_pp} by", "{made} {s}"),
    "producer": Relation(
        "work", "org",
        ("{s} was released by {o}.", "{o} released the {kind} {s}.",
         "The {kind} {s} came out through {o}."),
        ("{o} released {s}.", "The catalogue of {o} includes {s}."),
        ("the {producer} that released {x}", "the {producer} behind {x}",
         "the {producer} of {x}"),
        ("Which {producer} released {x}?", "Who released {x}?",
         "Which {producer} put out {x}?"),
        "{s} released by", "released {s}"),
}


@dataclass(frozen=True)
class Attribute:
    type: str
    sentences: tuple[str, ...]   # {s} entity, {v} value
    ask: tuple[str, ...]
    query: str


ATTRIBUTES: dict[str, Attribute] = {
    "birth_year": Attribute("person", ("{s} was born in {v}.",
                                       "{s} (born {v}) is recorded in the civil registers.",
                                       "The year of {s}'s birth was {v}."),
                            ("In what year was {x} born?", "When was {x} born?",
                             "What is the birth year of {x}?"), "{s} born year"),
    "occupation": Attribute("person", ("{s} worked as {v_a}.", "By profession {s} was {v_a}.",
                                       "{s} trained and practised as {v_a}."),
                            ("What was the occupation of {x}?", "What did {x} do for a living?",
                             "What profession did {x} practise?"), "{s} profession"),
    "founded_year": Attribute("org", ("{s} was established in {v}.", "{s} dates from {v}.",
                                      "{s} opened its doors in {v}."),
                              ("In what year was {x} founded?", "When was {x} established?",
                               "What year was {x} set up?"), "{s} founded year"),
    "population": Attribute("city", ("{s} has a population of about {v}.",
                                     "Some {v} people live in {s}.",
                                     "The latest census counted {v} residents in {s}."),
                            ("What is the population of {x}?", "How many people live in {x}?",
                             "About how many residents does {x} have?"), "{s} population"),
    "language": Attribute("country", ("The official language of {s} is {v}.",
                                      "Most people in {s} speak {v}.",
                                      "{v} is the national language of {s}."),
                          ("What is the official language of {x}?",
                           "Which language is spoken in {x}?",
                           "What is the national language of {x}?"), "{s} language"),
    "release_year": Attribute("work", ("{s} was released in {v}.", "{s} first appeared in {v}.",
                                       "{s} came out in {v}."),
                              ("In what year was {x} released?", "When did {x} come out?",
                               "What year did {x} first appear?"), "{s} released year"),
}

COMPARABLE = {  # attribute -> (question when the smaller value wins, when the larger wins)
    "birth_year": (("Who was born first, {a} or {b}?", "Which of {a} and {b} was born earlier?"),
                   ("Who was born later, {a} or {b}?", "Which of {a} and {b} is younger?")),
    "founded_year": (("Which was founded first, {a} or {b}?", "Which is older, {a} or {b}?"),
                     ("Which was founded more recently, {a} or {b}?",
                      "Which was established later, {a} or {b}?")),
    "release_year": (("Which came out first, {a} or {b}?", "Which was released earlier, {a} or {b}?"),
                     ("Which was released later, {a} or {b}?", "Which is the newer work, {a} or {b}?")),
    "population": (("Which has fewer residents, {a} or {b}?", "Which city is smaller, {a} or {b}?"),
                   ("Which has more residents, {a} or {b}?", "Which city is larger, {a} or {b}?")),
}
# The same comparisons among three entities (when the world has 3-hop questions): a guess
# is right one time in three, not one in two.
COMPARABLE_THREE = {
    "birth_year": (("Who was born first: {a}, {b} or {c}?",
                    "Which of {a}, {b} and {c} was born earliest?"),
                   ("Who was born last: {a}, {b} or {c}?",
                    "Which of {a}, {b} and {c} is the youngest?")),
    "founded_year": (("Which was founded first: {a}, {b} or {c}?",
                      "Which is the oldest: {a}, {b} or {c}?"),
                     ("Which was founded most recently: {a}, {b} or {c}?",
                      "Which of {a}, {b} and {c} was established last?")),
    "release_year": (("Which came out first: {a}, {b} or {c}?",
                      "Which of {a}, {b} and {c} was released earliest?"),
                     ("Which was released last: {a}, {b} or {c}?",
                      "Which is the newest work: {a}, {b} or {c}?")),
    "population": (("Which has the fewest residents: {a}, {b} or {c}?",
                    "Which city is the smallest: {a}, {b} or {c}?"),
                   ("Which has the most residents: {a}, {b} or {c}?",
                    "Which city is the largest: {a}, {b} or {c}?")),
}
THREE_WAY_SHARE = 0.5  # of "which is larger" questions, where the world has 3-hop questions
SAME_QUESTIONS = {  # (entity type, path of relations) -> phrasings; answered yes / no
    ("person", ("born_in",)): ("Were {a} and {b} born in the same city?",
                               "Do {a} and {b} share a city of birth?"),
    ("person", ("born_in", "country")): ("Were {a} and {b} born in the same country?",
                                         "Do {a} and {b} come from the same country?"),
    ("org", ("hq",)): ("Are {a} and {b} headquartered in the same city?",
                       "Do {a} and {b} have their head offices in the same city?"),
    ("org", ("hq", "country")): ("Are {a} and {b} headquartered in the same country?",
                                 "Are the head offices of {a} and {b} in the same country?"),
}

FILLER = {
    "person": ["{s} was known for a meticulous, unhurried way of working.",
               "Contemporaries described {s} as {adj} and {adj2}.",
               "A bundle of letters written by {s} survives in a private {noun}.",
               "{s} often spent the summer months walking in the {noun2} country.",
               "Later commentators have debated how {adj} the early work of {s} really was.",
               "A portrait of {s} hangs in a small {noun} gallery.",
               "{s} rarely gave interviews and kept a {adj} public profile."],
    "org": ["{s} grew steadily during its first decades.",
            "The early records of {s} describe a {adj} and {adj2} culture.",
            "{s} is known for an unusual {noun} in its main hall.",
            "Over the years {s} changed owners twice without changing its name.",
            "Staff at {s} still follow a {adj} tradition of annual {noun2} meetings.",
            "{s} publishes a short yearly report on its activities."],
    "city": ["{s} is known for its {adj} streets and an old {noun}.",
             "The climate around {s} is {adj} for most of the year.",
             "A {noun2} market is held in {s} every spring.",
             "{s} grew around a river crossing.",
             "Visitors to {s} often mention its {adj} {noun}.",
             "Local historians describe the old town of {s} as {adj2}."],
    "country": ["{s} has a {adj} coastline and a mountainous interior.",
                "The economy of {s} rests on farming, trade and a {adj} {noun} industry.",
                "{s} is divided into several provinces.",
                "Festivals in {s} often feature a {noun2} procession.",
                "The flag of {s} shows a {adj} {noun} on a plain field."],
    "work": ["Critics called {s} {adj} and {adj2}.",
             "{s} sold modestly at first but found a loyal audience.",
             "A restored edition of {s} appeared decades later.",
             "{s} opens with a long scene set in a {noun}.",
             "The {noun2} motif in {s} has been widely discussed."],
}
ADJ = ["quiet", "ambitious", "unusual", "careful", "restless", "generous", "stern", "lively",
       "modest", "austere", "colourful", "gentle", "stubborn", "curious", "mild", "windy"]
NOUN = ["archive", "tower", "fountain", "library", "courtyard", "clock", "garden", "bridge",
        "museum", "harbour", "chapel", "warehouse"]


# --------------------------------------------------------------------------- world


@dataclass
class World:
    config: WorldConfig
    entities: dict[str, Entity]
    docs: list[dict]                        # {"id", "contents"}
    splits: dict[str, list[QAExample]]

    def stats(self) -> dict:
        per_split = {}
        for split, qs in self.splits.items():
            per_split[split] = {
                "questions": len(qs),
                "hops": dict(sorted(Counter(q.metadata["hops"] for q in qs).items())),
                "types": dict(sorted(Counter(q.metadata["type"] for q in qs).items())),
            }
        words = [len(d["contents"].split("\n", 1)[1].split()) for d in self.docs]
        return {
            "docs": len(self.docs),
            "entities": sum(not e.distractor for e in self.entities.values()),
            "distractor_docs": sum(e.distractor for e in self.entities.values()),
            "doc_words_min": min(words), "doc_words_mean": round(sum(words) / len(words), 1),
            "doc_words_max": max(words),
            "splits": per_split,
        }


class _Builder:
    def __init__(self, cfg: WorldConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.entities: dict[str, Entity] = {}
        self.used_names: set[str] = set()
        self.own_word_aliases: list[tuple[Entity, str]] = []   # see settle_aliases
        self.by_type: dict[tuple[str, str], list[Entity]] = {}  # (split, type) -> real entities

    # ---- names
    def _unique(self, make, near_pool: list[str], fallback=None) -> str:
        for attempt in range(400):
            if near_pool and self.rng.random() < self.cfg.near_dup_rate:
                name = self._near(self.rng.choice(near_pool))
            else:
                name = make()
            if attempt >= 100 and fallback is not None:
                name = fallback(name)  # a short name has few one-letter variants: go further
            if name.lower() not in self.used_names:
                self.used_names.add(name.lower())
                return name
        raise RuntimeError("could not find a fresh name; lower `entities`")

    def _near(self, name: str) -> str:
        """Change one distinctive word: 'Kelbaan Records' -> 'Kelban Records', never the
        shared parts ('Records', 'of', 'The') that would make the names unrelated."""
        parts = name.split(" ")
        distinctive = [i for i, p in enumerate(parts) if p not in _COMMON_WORDS and len(p) > 2]
        i = self.rng.choice(distinctive or [0])
        parts[i] = nm.near_duplicate(parts[i], self.rng)
        return " ".join(parts)

    def _add(self, e: Entity) -> Entity:
        self.entities[e.key] = e
        if not e.distractor:
            self.by_type.setdefault((e.split, e.type), []).append(e)
        return e

    def pool(self, split: str, type_: str) -> list[Entity]:
        return self.by_type.get((split, type_), [])

    # ---- entities of one split's cluster
    def make_cluster(self, split: str, n: int) -> None:
        rng = self.rng
        counts = {"country": max(3, round(0.03 * n)), "city": max(6, round(0.13 * n)),
                  "person": max(12, round(0.42 * n)), "org": max(6, round(0.24 * n))}
        counts["work"] = max(5, n - sum(counts.values()))
        all_names = lambda t: [e.name for e in self.entities.values() if e.type == t]  # noqa: E731

        for _ in range(counts["country"]):
            name = self._unique(lambda: nm.country_name(rng), all_names("country"))
            e = self._add(Entity(f"k{len(self.entities)}", "country", name, split))
            e.attrs["language"] = nm.language_name(name, rng)
            e.alias = f"{rng.choice(['Republic', 'Kingdom', 'Federation', 'Commonwealth'])} of {name}"
        countries = self.pool(split, "country")
        for i in range(counts["city"]):
            name = self._unique(lambda: nm.city_name(rng), all_names("city"),
                                fallback=lambda n: nm.longer(n, rng))
            e = self._add(Entity(f"c{len(self.entities)}", "city", name, split))
            # every country gets at least one city first, so each has a capital
            e.rels["country"] = countries[i % len(countries)].key if i < len(countries) \
                else rng.choice(countries).key
            e.attrs["population"] = f"{rng.randrange(8, 990) * 1000:,}"
            e.alias = self._unique(lambda: "Old " + nm.city_name(rng), [])
        for c in countries:
            c.rels["capital"] = rng.choice([x for x in self.pool(split, "city")
                                            if x.rels["country"] == c.key]).key
        cities = self.pool(split, "city")
        for _ in range(counts["person"]):
            name = self._unique(lambda: nm.person_name(rng), all_names("person"))
            e = self._add(Entity(f"p{len(self.entities)}", "person", name, split))
            e.attrs["birth_year"] = rng.randrange(1790, 1985)
            e.attrs["occupation"] = rng.choice(nm.OCCUPATIONS)
            e.rels["born_in"] = rng.choice(cities).key
            given, family = name.split(" ", 1)
            initial = f"{given[0]}. {family}"
            if rng.random() < 0.5 and initial.lower() not in self.used_names:
                e.alias = initial
                self.used_names.add(initial.lower())
            else:
                e.alias = self._unique(
                    lambda g=given, f=family: f"{g} '{nm.syllables(rng, 1).capitalize()}' {f}", [])
        people = self.pool(split, "person")
        shuffled = people[:]
        rng.shuffle(shuffled)
        for a, b in zip(shuffled[0:len(shuffled) // 3:2], shuffled[1:len(shuffled) // 3:2]):
            a.rels["spouse"], b.rels["spouse"] = b.key, a.key
            # A marriage is told in both documents, or (reverse) in only one of them.
            if rng.random() < self.cfg.reverse_rate:
                rng.choice([a, b]).stated_in_object.add("spouse")
        for _ in range(counts["org"]):
            kind = rng.choice(list(nm.ORG_KINDS))
            name = self._unique(lambda k=kind: nm.org_name(rng, k), all_names("org"))
            e = self._add(Entity(f"o{len(self.entities)}", "org", name, split))
            founder = rng.choice(people)
            e.attrs["kind"] = kind
            e.attrs["founded_year"] = min(founder.attrs["birth_year"] + rng.randrange(22, 55), 2024)
            e.rels["founder"] = founder.key
            e.rels["hq"] = rng.choice(cities).key
            first = name.replace("University of ", "").split(" ")[0]
            if first.lower() not in self.used_names:
                # the names taken grow as they always have, so that a seed's world stays
                # the same but for these aliases ("College", "Institute" were aliases)
                self.used_names.add(first.lower())
                stem = _org_stem(name)
                e.alias = stem if stem == first or stem.lower() not in self.used_names else None
                if e.alias and stem != first:
                    self.own_word_aliases.append((e, first))
        orgs = self.pool(split, "org")
        for p in people:
            if rng.random() < 0.6:
                p.rels["employer"] = rng.choice(orgs).key
        for _ in range(counts["work"]):
            kind = rng.choice(list(nm.WORK_KINDS))
            name = self._unique(lambda: nm.work_title(rng), all_names("work"),
                                fallback=lambda n: nm.longer(n, rng))
            e = self._add(Entity(f"w{len(self.entities)}", "work", name, split))
            creator = rng.choice(people)
            e.attrs["kind"] = kind
            e.attrs["release_year"] = min(creator.attrs["birth_year"] + rng.randrange(20, 60), 2024)
            e.rels["creator"] = creator.key
            producers = [o for o in orgs if o.attrs["kind"] == nm.WORK_KINDS[kind][4]]
            if producers:
                e.rels["producer"] = rng.choice(producers).key
        # Which relations are told only in the object's document.
        for e in [x for x in self.entities.values() if x.split == split]:
            for rel in e.rels:
                if rel != "spouse" and rng.random() < self.cfg.reverse_rate:
                    e.stated_in_object.add(rel)

    def settle_aliases(self) -> None:
        """An organisation's own-word alias ("Ruon" of "College of Ruon") that another
        entity also goes by, or is named, goes back to the kind's word it had: these words
        are checked against the names taken only now, and an alias is never removed (a
        question draws for one only when there is one), so that a seed's world is otherwise
        the one it was."""
        taken = Counter(n.lower() for e in self.entities.values()
                        for n in (e.name, e.alias) if n)
        for e, first in self.own_word_aliases:
            if taken[e.alias.lower()] > 1:
                e.alias = first

    def make_distractors(self, split: str) -> None:
        rng = self.rng
        real = [e for e in self.entities.values() if e.split == split and not e.distractor]
        for e in real:
            n = int(self.cfg.distractors) + (rng.random() < self.cfg.distractors % 1)
            for _ in range(n):
                name = self._unique(lambda n=e.name: self._near(n), [], fallback=self._near)
                d = self._add(Entity(f"x{len(self.entities)}", e.type, name, split,
                                     distractor=True))
                d.attrs = dict(e.attrs)
                # partial, different facts: same kind of thing, other values
                for key, value in d.attrs.items():
                    if isinstance(value, int):  # a year: near, different, not in the future
                        d.attrs[key] = min(value + rng.choice([-3, -2, -1, 1, 2, 3]), 2024)
                    elif key == "occupation":
                        d.attrs[key] = rng.choice(nm.OCCUPATIONS)
                for rel, target in e.rels.items():
                    if rel != "spouse" and rng.random() < 0.6:
                        candidates = [c for c in self.pool(split, RELATIONS[rel].obj)
                                      if c.attrs.get("kind") == self.entities[target].attrs.get("kind")]
                        d.rels[rel] = rng.choice(candidates).key
                if rng.random() < self.cfg.mention_rate:
                    d.attrs["not_confused_with"] = e.key

    # ---- documents
    def _fill(self, template: str, s: str, o: str = "", e: Entity | None = None) -> str:
        kind = (e.attrs.get("kind") if e else None) or ""
        made = made_pp = maker = producer = ""
        if kind in nm.WORK_KINDS:
            made, made_pp, maker, producer, _ = nm.WORK_KINDS[kind]
        return template.format(s=s, o=o, kind=kind, made=made, made_pp=made_pp, maker=maker,
                               producer=producer)

    def _pick(self, options: tuple[str, ...]) -> str:
        return self.rng.choice(options) if self.cfg.paraphrase else options[0]

    def fact_sentence(self, subj: Entity, rel: str) -> str:
        obj = self.entities[subj.rels[rel]]
        r = RELATIONS[rel]
        options = r.reverse if rel in subj.stated_in_object else r.forward
        return self._fill(self._pick(options), subj.name, obj.name, subj)

    def attr_sentence(self, e: Entity, attr: str) -> str:
        return _attr_text(self._pick(ATTRIBUTES[attr].sentences), e.name, e.attrs[attr])

    def write_docs(self) -> list[dict]:
        rng = self.rng
        told_here: dict[str, list[str]] = {k: [] for k in self.entities}
        for e in self.entities.values():
            for rel in e.rels:
                if rel == "spouse" and rel in e.stated_in_object:
                    continue  # the partner's own document already tells this marriage
                where = e.rels[rel] if rel in e.stated_in_object else e.key
                told_here[where].append(self.fact_sentence(e, rel))
        docs = []
        for e in self.entities.values():
            sentences = [self._intro(e)]
            sentences += [self.attr_sentence(e, a) for a in ATTRIBUTES
                          if a in e.attrs and ATTRIBUTES[a].type == e.type
                          and not (a == "occupation")]  # the intro states the occupation
            sentences += told_here[e.key]
            body = sentences[:1] + rng.sample(sentences[1:], len(sentences) - 1)
            if e.distractor and "not_confused_with" in e.attrs:
                other = self.entities[e.attrs["not_confused_with"]]
                body.append(f"{e.name} should not be confused with {other.name}.")
            target = rng.randrange(*self.cfg.doc_words)
            fillers = FILLER[e.type][:]
            rng.shuffle(fillers)
            while sum(len(s.split()) for s in body) < target and fillers:
                adj, adj2 = rng.choice(ADJ), rng.choice(ADJ)
                if adj2 == adj:   # "ambitious and ambitious": the next one (no extra draw)
                    adj2 = ADJ[(ADJ.index(adj) + 1) % len(ADJ)]
                body.insert(rng.randrange(1, len(body) + 1), fillers.pop().format(
                    s=e.name, adj=adj, adj2=adj2, noun=rng.choice(NOUN), noun2=rng.choice(NOUN)))
            docs.append({"entity": e.key, "title": e.name,
                         "text": fix_articles(" ".join(body))})
        rng.shuffle(docs)
        out = []
        for i, d in enumerate(docs):
            doc_id = f"doc-{i}"
            self.entities[d["entity"]].doc_id = doc_id
            out.append({"id": doc_id, "contents": f"{d['title']}\n{d['text']}"})
        return out

    def _intro(self, e: Entity) -> str:
        a = e.attrs
        alias = ""
        if e.alias and not e.distractor:
            alias = {"person": f", also known as {e.alias},",
                     "org": f" (often simply called {e.alias})",
                     "city": f", formerly known as {e.alias},",
                     "country": f", officially the {e.alias},"}.get(e.type, "")
        if e.type == "person":
            return f"{e.name}{alias} was {_a(a['occupation'])}."
        if e.type == "org":
            return f"{e.name}{alias} is {_a(nm.ORG_KINDS[a['kind']][1])}."
        if e.type == "city":
            return f"{e.name}{alias} is a city."
        if e.type == "country":
            return f"{e.name}{alias} is a sovereign country."
        return f"{e.name} is a {a['kind']}."

    # ---- questions
    def mention(self, e: Entity) -> tuple[str, str]:
        """How a question names an entity: (text, form)."""
        if e.alias and self.rng.random() < self.cfg.alias_rate:
            return e.alias, "alias"
        return e.name, "name"

    def describe(self, e: Entity) -> str | None:
        """A description that fits exactly one entity of the whole world, or None."""
        a = e.attrs
        if e.type == "person":
            text, match = f"the {a['occupation']} born in {a['birth_year']}", \
                lambda x: x.attrs.get("occupation") == a["occupation"] and \
                x.attrs.get("birth_year") == a["birth_year"]
        elif e.type == "org":
            noun = nm.ORG_KINDS[a["kind"]][1]
            text, match = f"the {noun} founded in {a['founded_year']}", \
                lambda x: x.attrs.get("kind") == a["kind"] and \
                x.attrs.get("founded_year") == a["founded_year"]
        elif e.type == "work":
            text, match = f"the {a['release_year']} {a['kind']}", \
                lambda x: x.attrs.get("kind") == a["kind"] and \
                x.attrs.get("release_year") == a["release_year"]
        elif e.type == "country":
            text, match = f"the country whose official language is {a['language']}", \
                lambda x: x.attrs.get("language") == a["language"]
        else:
            return None
        same = [x for x in self.entities.values() if x.type == e.type and match(x)]
        return text if len(same) == 1 else None

    def lookup(self, subj: Entity, rel: str) -> dict:
        """One hop: what is looked up, in which document, and how an expert would search."""
        if rel in ATTRIBUTES:
            att = ATTRIBUTES[rel]
            return {"subject": subj.name, "relation": rel, "answer": str(subj.attrs[rel]),
                    "doc_id": subj.doc_id, "stated_in": "subject",
                    "query": att.query.format(s=subj.name),
                    "need": f"the {rel.replace('_', ' ')} of {subj.name}",
                    "fact": _attr_text(att.sentences[0], subj.name, subj.attrs[rel])}
        obj = self.entities[subj.rels[rel]]
        r = RELATIONS[rel]
        reverse = rel in subj.stated_in_object
        return {"subject": subj.name, "relation": rel, "answer": obj.name,
                "doc_id": obj.doc_id if reverse else subj.doc_id,
                "stated_in": "object" if reverse else "subject",
                "query": self._fill(r.query_reverse if reverse else r.query_forward,
                                    subj.name, obj.name, subj),
                "need": self._fill(r.noun_phrase[0].replace("{x}", "{s}"), subj.name, "", subj),
                "fact": self._fill(r.forward[0], subj.name, obj.name, subj)}

    def answers(self, value: str, e: Entity | None) -> list[str]:
        out = [value]
        # "I. Marrow" is too loose to accept as a person's answer; other aliases are names
        if e is not None and e.alias and e.type != "person":
            out.append(e.alias)
        if "," in value and value.replace(",", "").isdigit():
            out.append(value.replace(",", ""))
        return out

    def chain_question(self, split: str, hops: int) -> QAExample | None:
        rng = self.rng
        anchors = [e for t in ("person", "org", "city", "country", "work")
                   for e in self.pool(split, t)]
        e0 = rng.choice(anchors)
        path: list[dict] = []
        current, visited = e0, {e0.key}
        for step in range(hops):
            last = step == hops - 1
            options = [r for r in current.rels if self.entities[current.rels[r]].key not in visited]
            if last:
                options += [a for a in ATTRIBUTES if ATTRIBUTES[a].type == current.type]
            prev_doc = path[-1]["doc_id"] if path else None
            options = [o for o in options if self.lookup(current, o)["doc_id"] != prev_doc]
            if not options:
                return None
            rel = rng.choice(options)
            path.append(self.lookup(current, rel))
            if rel in RELATIONS:
                current = self.entities[current.rels[rel]]
                visited.add(current.key)
        text, form = self.mention(e0)
        description = self.describe(e0) if path[0]["stated_in"] == "subject" else None
        if hops >= 2 and description and rng.random() < self.cfg.description_rate:
            # the agent does not know the name yet: its first query is the description
            text, form = description, "description"
            path[0]["query"] = description.removeprefix("the ")
            phrase = RELATIONS[path[0]["relation"]].noun_phrase[0] \
                if path[0]["relation"] in RELATIONS else \
                f"the {path[0]['relation'].replace('_', ' ')} of {{x}}"
            path[0]["need"] = self._fill(phrase.replace("{x}", "{s}"), description, "", e0)
        x = text
        entity = e0
        for hop in path[:-1]:
            phrase = self._pick(RELATIONS[hop["relation"]].noun_phrase)
            x = self._fill(phrase.replace("{x}", "{s}"), x, "", entity)
            entity = self.entities[entity.rels[hop["relation"]]]
        final = path[-1]["relation"]
        if final in RELATIONS:
            question = self._fill(self._pick(RELATIONS[final].ask).replace("{x}", "{s}"),
                                  x, "", entity)
            answer_entity = self.entities[entity.rels[final]]
        else:
            question = self._pick(ATTRIBUTES[final].ask).format(x=x)
            answer_entity = None
        question = question[0].upper() + question[1:]
        answer = path[-1]["answer"]
        return self._example(question, self.answers(answer, answer_entity), path,
                             qtype="single" if hops == 1 else "bridge",
                             extra={"anchor_form": form})

    def comparison_question(self, split: str, max_hops: int) -> QAExample | None:
        rng = self.rng
        kinds = [("compare", a) for a in COMPARABLE]
        kinds += [("same", k) for k in SAME_QUESTIONS if 2 * len(k[1]) <= max_hops]
        kind, what = rng.choice(kinds)
        if kind == "compare":
            k = 3 if max_hops >= 3 and rng.random() < THREE_WAY_SHARE else 2
            return self._compare_question(split, what, k)
        return self._same_question(split, *what)

    def _compare_question(self, split: str, what: str, k: int) -> QAExample | None:
        """Which of k entities has the larger (or smaller) value: one lookup per entity."""
        rng = self.rng
        value = lambda e: int(str(e.attrs[what]).replace(",", ""))  # noqa: E731
        pool = [e for e in self.pool(split, ATTRIBUTES[what].type) if what in e.attrs]
        if len({value(e) for e in pool}) < k:
            return None
        # distinct values, so there is one winner; drawn here rather than failed and redrawn
        picked: list[Entity] = []
        while len(picked) < k:
            e = rng.choice(pool)
            if all(value(e) != value(p) for p in picked):
                picked.append(e)
        larger = rng.random() < 0.5
        winner = (max if larger else min)(picked, key=value)
        names = dict(zip("abc", (self.mention(e)[0] for e in picked)))
        templates = COMPARABLE if k == 2 else COMPARABLE_THREE
        question = self._pick(templates[what][larger]).format(**names)
        path = [self.lookup(e, what) for e in picked]
        judgement = "; ".join(f"{e.name}: {e.attrs[what]}" for e in picked)
        return self._example(question, self.answers(winner.name, winner), path,
                             qtype="comparison", extra={"judgement": judgement, "options": k})

    def _same_question(self, split: str, type_: str, rels: tuple[str, ...]) -> QAExample | None:
        """Do two entities share an end of the relation path: yes or no, drawn 50/50."""
        rng = self.rng
        pool = [e for e in self.pool(split, type_) if rels[0] in e.rels]

        def end(e: Entity) -> Entity:
            for r in rels:
                e = self.entities[e.rels[r]]
            return e

        want_same = rng.random() < 0.5
        # the first entity comes from those with a partner for the drawn answer: a "yes" that
        # found none and was redrawn would tilt the mix to "no"
        ends = Counter(end(e).key for e in pool)
        firsts = [e for e in pool
                  if (ends[end(e).key] >= 2 if want_same else ends[end(e).key] < len(pool))]
        if not firsts:
            return None
        a = rng.choice(firsts)
        b = rng.choice([b for b in pool if b is not a and (end(b).key == end(a).key) == want_same])
        path = []
        for e in (a, b):
            cur = e
            for r in rels:
                path.append(self.lookup(cur, r))
                cur = self.entities[cur.rels[r]]
        ta, tb = self.mention(a)[0], self.mention(b)[0]
        question = self._pick(SAME_QUESTIONS[(type_, rels)]).format(a=ta, b=tb)
        answer = "yes" if want_same else "no"
        judgement = f"{a.name}: {end(a).name}; {b.name}: {end(b).name}"
        return self._example(question, [answer], path, qtype="comparison",
                             extra={"judgement": judgement, "options": 2})

    def _example(self, question: str, golden: list[str], path: list[dict], qtype: str,
                 extra: dict) -> QAExample:
        meta = {"type": qtype, "hops": len(path), "difficulty": self.cfg.difficulty,
                "gold_doc_ids": [h["doc_id"] for h in path], "chain": path, **extra}
        return QAExample(id="", question=question, golden_answers=golden, metadata=meta)

    def quotas(self, n: int) -> dict[str | int, int]:
        """How many of n questions each kind gets: "comparison", then each hop count of a
        chain; largest-remainder rounding, so the counts sum to n."""
        share = self.cfg.comparison_share
        total = sum(self.cfg.hop_mix.values())
        exact = {"comparison": share * n}
        exact |= {h: (1 - share) * n * w / total for h, w in sorted(self.cfg.hop_mix.items())}
        out = {kind: int(x) for kind, x in exact.items()}
        by_remainder = sorted(exact, key=lambda kind: exact[kind] - out[kind], reverse=True)
        for kind in by_remainder[:n - sum(out.values())]:
            out[kind] += 1
        return out

    def make_questions(self, split: str, n: int) -> list[QAExample]:
        """n distinct questions in the configured mix. A failed or repeated draw is retried
        as the same kind: starting over would favour the kinds that fail least (1-hop
        chains, comparisons)."""
        rng = self.rng
        # the longest chain asked for: a hop count of weight 0 is not (it opened three-way
        # comparisons in a world of 2-hop chains)
        max_hops = max(h for h, w in self.cfg.hop_mix.items() if w > 0)
        seen: set[str] = set()
        out: list[QAExample] = []
        for kind, quota in self.quotas(n).items():
            made = attempts = 0
            while made < quota:
                attempts += 1
                if attempts > 100 * quota + 1000:
                    what = kind if kind == "comparison" else f"{kind}-hop chain"
                    raise RuntimeError(
                        f"{split} split: could only make {made} of {quota} distinct {what} "
                        f"questions after {attempts - 1} attempts ({len(out)} of {n} questions "
                        f"in all); raise `entities`, lower the question count or change the mix")
                q = self.comparison_question(split, max_hops) if kind == "comparison" \
                    else self.chain_question(split, kind)
                if q is None or q.question in seen:
                    continue
                seen.add(q.question)
                out.append(q)
                made += 1
        rng.shuffle(out)  # kinds were made in blocks
        for i, q in enumerate(out):
            q.id = f"{split}-{i}"
        return out


# Vowel letters that sound like a consonant ("a university") and silent h's ("an hour").
_A_BEFORE = ("uni", "use", "usu", "uti", "ura", "ukr", "uto", "eu", "one", "once")
_AN_BEFORE = ("hour", "honest", "honour", "honor", "heir")
_ARTICLE = re.compile(r"\b([Aa])n? (?=([A-Za-z]+))")


def _article(word: str) -> str:
    w = word.lower()
    if w.startswith(_AN_BEFORE):
        return "an"
    return "an" if w[:1] in ("a", "e", "i", "o", "u") and not w.startswith(_A_BEFORE) else "a"


def _a(noun: str) -> str:
    return f"{_article(noun)} {noun}"


def fix_articles(text: str) -> str:
    """"a" or "an" before every word as it is said: templates write "a {kind}" and the kind
    may be "album"."""
    return _ARTICLE.sub(lambda m: (m.group(1) + _article(m.group(2))[1:]) + " ", text)


def _attr_text(template: str, name: str, value) -> str:
    return template.format(s=name, v=value, v_a=_a(str(value)))


def generate_world(cfg: WorldConfig | None = None, **overrides) -> World:
    """Build the whole world in memory: deterministic for a given config (seed included),
    or for WorldConfig's fields given as keywords."""
    if cfg is not None and overrides:
        # ignored before; laid over a config they would keep its filled-in preset values
        raise TypeError(f"generate_world: give a WorldConfig or its fields, not both "
                        f"(got {', '.join(sorted(overrides))} beside a config)")
    cfg = cfg or WorldConfig(**overrides)
    b = _Builder(cfg)
    sizes = [max(20, round(cfg.entities * s)) for s in cfg.split_shares]
    for split, n in zip(SPLITS, sizes):
        b.make_cluster(split, n)
    for split in SPLITS:
        b.make_distractors(split)
    b.settle_aliases()
    docs = b.write_docs()
    counts = {"train": cfg.n_train, "dev": cfg.n_dev, "test": cfg.n_test}
    splits = {s: b.make_questions(s, counts[s]) for s in SPLITS}
    return World(cfg, b.entities, docs, splits)


WORLD_FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "world.json")


def world_corpus(data: str | Path | None) -> Path | None:
    """The corpus.jsonl of the `seekrl world` folder that QA data comes from (a file in it,
    the folder, or FOLDER:SPLIT), or None when the data is no world's."""
    if not data:
        return None
    spec = str(data)
    if spec.startswith(("hf:", "flashrag:", "http://", "https://")):
        return None
    path = Path(spec)
    if not path.exists():
        folder, _, _ = spec.rpartition(":")
        path = Path(folder) if folder else path
    folder = path if path.is_dir() else path.parent
    if (folder / "world.json").is_file() and (folder / "corpus.jsonl").is_file():
        return folder / "corpus.jsonl"
    return None


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl, train/dev/test.jsonl (FlashRAG) and world.json (config, stats)."""
    from seekrl.data.qa import write_qa_jsonl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl"}
    with open(paths["corpus"], "w", encoding="utf-8") as f:
        for d in world.docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    for split, qs in world.splits.items():
        paths[split] = out / f"{split}.jsonl"
        write_qa_jsonl(paths[split], qs)
    paths["world"] = out / "world.json"
    cfg = asdict(world.config)
    cfg["hop_mix"] = {str(k): v for k, v in world.config.hop_mix.items()}
    paths["world"].write_text(json.dumps({"config": cfg, "stats": world.stats()}, indent=2))
    return paths
