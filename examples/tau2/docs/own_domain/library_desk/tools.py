"""The front desk's tools: what the agent can look up and change.

Tools check only that the data makes sense (known ids, a loan that belongs to the member) and raise
ValueError otherwise; tau2 turns that into an error message for the agent. The business rules (how often
a loan may be renewed, when a hold is allowed) are in policy.md on purpose: following them is what the
agent is graded on. The docstrings are the tool descriptions the agent reads.

No `from __future__ import annotations` here: tau2 builds each tool's schemas from its live type hints, and
a return type left as a string (`-> Loan`) breaks tau2's `get_tool_signatures`.
"""

from datetime import date, timedelta

from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool

from .data_model import AccountHold, AccountLoan, Book, Hold, LibraryDB, Loan, Member, MemberAccount

RENEWAL_DAYS = 14


class LibraryTools(ToolKitBase):
    """Tools of the library's front desk."""

    db: LibraryDB  # set by ToolKitBase.__init__(db)

    def _member(self, member_id: str) -> Member:
        if member_id not in self.db.members:
            raise ValueError(f"Member {member_id} not found")
        return self.db.members[member_id]

    def _book(self, book_id: str) -> Book:
        if book_id not in self.db.books:
            raise ValueError(f"Book {book_id} not found")
        return self.db.books[book_id]

    def _next_hold_id(self) -> str:
        # Derived from the table, not from a counter or a uuid: replaying the same calls makes the same ids.
        highest = max((int(hold_id.removeprefix("H")) for hold_id in self.db.holds), default=0)
        return f"H{highest + 1:03d}"

    @is_tool(ToolType.READ)
    def find_member_by_email(self, email: str) -> str:
        """Find a member's id by the email address on their account.

        Args:
            email: The member's email address, such as 'someone@example.org'.

        Returns:
            The member id.

        Raises:
            ValueError: If no member has this email address.
        """
        for member in self.db.members.values():
            if member.email.lower() == email.strip().lower():
                return member.member_id
        raise ValueError("No member with this email address")

    @is_tool(ToolType.READ)
    def get_member(self, member_id: str) -> MemberAccount:
        """Get a member's account: their details and fines owed, their loans and their holds.

        Each loan shows the book's title, its due date, the renewals used and how many holds other
        members have on that book.

        Args:
            member_id: The member id, such as 'M001'.

        Returns:
            The member's account.

        Raises:
            ValueError: If the member is not found.
        """
        member = self._member(member_id)
        loans = [
            AccountLoan(
                **loan.model_dump(),
                title=self.db.books[loan.book_id].title,
                holds_by_others=sum(
                    h.book_id == loan.book_id and h.member_id != member_id for h in self.db.holds.values()
                ),
            )
            for loan in self.db.loans.values()
            if loan.member_id == member_id
        ]
        holds = [
            AccountHold(**hold.model_dump(), title=self.db.books[hold.book_id].title)
            for hold in self.db.holds.values()
            if hold.member_id == member_id
        ]
        return MemberAccount(member=member, loans=loans, holds=holds)

    @is_tool(ToolType.READ)
    def search_books(self, title: str) -> list[Book]:
        """Search the catalogue for books whose title contains the given text (case-insensitive).

        Args:
            title: Part of the title, such as 'orchard'.

        Returns:
            The matching books with their copies in total and available now (empty if none match).
        """
        needle = title.strip().lower()
        return [book for book in self.db.books.values() if needle in book.title.lower()]

    @is_tool(ToolType.WRITE)
    def renew_loan(self, member_id: str, loan_id: str) -> Loan:
        """Renew a member's loan: the due date moves 14 days later and the loan counts one more renewal.

        Args:
            member_id: The member id, such as 'M001'.
            loan_id: The id of the member's loan, such as 'L001'.

        Returns:
            The renewed loan.

        Raises:
            ValueError: If the member or the loan is not found, or the loan is not the member's.
        """
        self._member(member_id)
        loan = self.db.loans.get(loan_id)
        if loan is None or loan.member_id != member_id:
            raise ValueError(f"Loan {loan_id} not found for member {member_id}")
        loan.due_date = (date.fromisoformat(loan.due_date) + timedelta(days=RENEWAL_DAYS)).isoformat()
        loan.renewals_used += 1
        return loan

    @is_tool(ToolType.WRITE)
    def place_hold(self, member_id: str, book_id: str) -> Hold:
        """Place a hold for a member on a book, so that a copy is kept for them when one is returned.

        Args:
            member_id: The member id, such as 'M001'.
            book_id: The book id, such as 'B001'.

        Returns:
            The new hold.

        Raises:
            ValueError: If the member or the book is not found, or the member already holds this book.
        """
        self._member(member_id)
        self._book(book_id)
        if any(h.member_id == member_id and h.book_id == book_id for h in self.db.holds.values()):
            raise ValueError(f"Member {member_id} already has a hold on book {book_id}")
        hold = Hold(hold_id=self._next_hold_id(), member_id=member_id, book_id=book_id)
        self.db.holds[hold.hold_id] = hold
        return hold

    @is_tool(ToolType.WRITE)
    def cancel_hold(self, member_id: str, hold_id: str) -> Hold:
        """Cancel one of a member's holds.

        Args:
            member_id: The member id, such as 'M001'.
            hold_id: The id of the member's hold, such as 'H001'.

        Returns:
            The cancelled hold.

        Raises:
            ValueError: If the member or the hold is not found, or the hold is not the member's.
        """
        self._member(member_id)
        hold = self.db.holds.get(hold_id)
        if hold is None or hold.member_id != member_id:
            raise ValueError(f"Hold {hold_id} not found for member {member_id}")
        return self.db.holds.pop(hold_id)

    @is_tool(ToolType.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the member to a human librarian, with a summary of their issue.

        Only transfer if the member explicitly asks for a human, or if the policy and the tools do not
        let you solve their issue.

        Args:
            summary: A summary of the member's issue.

        Returns:
            A message saying that the transfer was made.
        """
        return "Transfer successful"
